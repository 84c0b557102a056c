"""NonZero, Compress, Unique and ReverseSequence: layers that pick or reorder elements by
their values, so that most of their output shapes are known only when they run."""

from __future__ import annotations

import attrs

from flowrt.engine.graph.layer_kind import layer_kind
from flowrt.engine.graph.layers.elementwise import expect_dtype
from flowrt.engine.graph.shapes import normalize_axis
from flowrt.errors import ShapeError
from flowrt.types import DataType, TensorInfo

I64 = DataType.INT64


@layer_kind("NonZero")
def infer_nonzero(desc, inputs, consts):
    x = inputs[0]
    return [TensorInfo(None if x.shape is None else (len(x.shape), None), I64)]


@attrs.frozen
class CompressDescriptor:
    """Compress: the slices along ``axis`` (or, without it, the elements of the flattened
    input) whose ``condition`` is true; a shorter condition drops the slices it does not reach."""

    axis: int | None = None


def check_condition_length(length: int, dim: int | str | None) -> None:
    """ShapeError when the condition is longer than what it selects from."""
    if isinstance(dim, int) and length > dim:
        raise ShapeError(f"Compress: a condition of at most {dim} values expected, got {length}")


@layer_kind("Compress", CompressDescriptor, min_inputs=2, max_inputs=2)
def infer_compress(desc: CompressDescriptor, inputs, consts):
    x, condition = inputs
    expect_dtype(condition, frozenset({DataType.BOOL}), "condition")
    if condition.shape is not None and len(condition.shape) != 1:
        raise ShapeError(f"Compress: a 1-D condition expected, got {condition.format_shape()}")
    kept = None if consts[1] is None else int(consts[1].sum())
    if desc.axis is None:
        if consts[1] is not None:
            check_condition_length(consts[1].size, TensorInfo(x.shape, x.dtype).num_elements)
        return [TensorInfo((kept,), x.dtype)]
    if x.shape is None:
        return [TensorInfo(None, x.dtype)]
    axis = normalize_axis(desc.axis, len(x.shape), "Compress")
    if consts[1] is not None:
        check_condition_length(consts[1].size, x.shape[axis])
    return [TensorInfo(x.shape[:axis] + (kept,) + x.shape[axis + 1 :], x.dtype)]


@attrs.frozen
class UniqueDescriptor:
    """Unique: the distinct elements (``axis`` unset: of the flattened input) or slices along
    ``axis``; ``sorted`` 1 orders them ascending, 0 by first occurrence. The outputs: the
    unique values, the index of each one's first occurrence, each input element's (slice's)
    position among them, and how often each occurs."""

    axis: int | None = None
    sorted: int = attrs.field(default=1, validator=attrs.validators.in_((0, 1)))


@layer_kind("Unique", UniqueDescriptor, num_outputs=4)
def infer_unique(desc: UniqueDescriptor, inputs, consts):
    x = inputs[0]
    if desc.axis is None:
        values, length = TensorInfo((None,), x.dtype), x.num_elements
    elif x.shape is None:
        values, length = TensorInfo(None, x.dtype), None
    else:
        axis = normalize_axis(desc.axis, len(x.shape), "Unique")
        values = TensorInfo(x.shape[:axis] + (None,) + x.shape[axis + 1 :], x.dtype)
        length = x.shape[axis]
    return [values, TensorInfo((None,), I64), TensorInfo((length,), I64), TensorInfo((None,), I64)]


@attrs.frozen
class ReverseSequenceDescriptor:
    """ReverseSequence: along ``time_axis``, reverse the first ``sequence_lens[b]`` elements
    of each batch entry b on ``batch_axis``; the two axes are 0 and 1."""

    batch_axis: int = attrs.field(default=1, validator=attrs.validators.in_((0, 1)))
    time_axis: int = attrs.field(default=0, validator=attrs.validators.in_((0, 1)))

    def __attrs_post_init__(self) -> None:
        if self.batch_axis == self.time_axis:
            raise ValueError(f"batch_axis and time_axis must differ, both are {self.time_axis}")


@layer_kind("ReverseSequence", ReverseSequenceDescriptor, min_inputs=2, max_inputs=2)
def infer_reverse_sequence(desc: ReverseSequenceDescriptor, inputs, consts):
    x, lens = inputs
    expect_dtype(lens, frozenset({I64}), "sequence_lens")
    if x.shape is not None and len(x.shape) < 2:
        raise ShapeError(f"ReverseSequence: an input of rank 2 or more expected, got {x.format_shape()}")
    if lens.shape is not None and len(lens.shape) != 1:
        raise ShapeError(f"ReverseSequence: 1-D sequence_lens expected, got {lens.format_shape()}")
    if x.shape is not None and lens.shape is not None:
        batch, n = x.shape[desc.batch_axis], lens.shape[0]
        if isinstance(batch, int) and isinstance(n, int) and batch != n:
            raise ShapeError(f"ReverseSequence: {batch} sequence_lens expected (the batch size), got {n}")
    return [x]
