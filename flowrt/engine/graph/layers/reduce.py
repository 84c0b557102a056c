"""Reductions: Reduce* over a set of axes, and ArgMax / ArgMin along one axis.

Reduce* take ``axes`` as an attribute in old opsets and as an optional second input in new ones
(ReduceSum from opset 13, the others from 18). No axes means every axis, unless
``noop_with_empty_axes`` is set: then the reduction step is the identity, though composite
reductions still apply their other steps (ReduceLogSum gives the log of its input).
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs

from flowrt.engine.graph.layer_kind import as_tuple, layer_kind
from flowrt.engine.graph.layers.elementwise import FLOAT_TYPES, NUMERIC_TYPES, expect_dtype
from flowrt.engine.graph.layers.reshape import const_ints
from flowrt.engine.graph.shapes import normalize_axis
from flowrt.errors import ShapeError
from flowrt.types import DataType, Dim, TensorInfo

_BOOL = frozenset({DataType.BOOL})
# ReduceMax and ReduceMin take bool from opset 20; the others are numeric.
REDUCE_DTYPES = {
    "ReduceSum": NUMERIC_TYPES,
    "ReduceMean": NUMERIC_TYPES,
    "ReduceProd": NUMERIC_TYPES,
    "ReduceMax": NUMERIC_TYPES | _BOOL,
    "ReduceMin": NUMERIC_TYPES | _BOOL,
    "ReduceL1": NUMERIC_TYPES,
    "ReduceL2": NUMERIC_TYPES,
    "ReduceSumSquare": NUMERIC_TYPES,
    "ReduceLogSum": FLOAT_TYPES,
    "ReduceLogSumExp": FLOAT_TYPES,
}
_FLAG = attrs.validators.in_((0, 1))


@attrs.frozen
class ReduceDescriptor:
    """Reduce*: ``axes`` (attribute form, old opsets), ``keepdims``, ``noop_with_empty_axes``."""

    axes: tuple[int, ...] | None = attrs.field(default=None, converter=as_tuple)
    keepdims: int = attrs.field(default=1, validator=_FLAG)
    noop_with_empty_axes: int = attrs.field(default=0, validator=_FLAG)


def reduce_axes(
    desc: ReduceDescriptor, rank: int, axes_input: Sequence[int] | None, where: str = "Reduce"
) -> tuple[int, ...]:
    """The sorted, non-negative axes to reduce; () means the reduction step is the identity.

    ``axes_input`` is the value of the optional axes input (None when absent).
    """
    axes = list(desc.axes) if desc.axes is not None else axes_input
    if not axes:
        return () if desc.noop_with_empty_axes else tuple(range(rank))
    norm = [normalize_axis(a, rank, where) for a in axes]
    if len(set(norm)) != len(norm):
        raise ShapeError(f"{where}: axes must be unique, got {list(axes)}")
    return tuple(sorted(norm))


def reduced_shape(shape: Sequence[Dim], axes: Sequence[int], keepdims: bool) -> tuple[Dim, ...]:
    """``shape`` with each of ``axes`` made 1 (keepdims) or dropped."""
    if keepdims:
        return tuple(1 if i in axes else d for i, d in enumerate(shape))
    return tuple(d for i, d in enumerate(shape) if i not in axes)


def _unknown_axes_shape(desc: ReduceDescriptor, data: TensorInfo, axes_info: TensorInfo) -> tuple | None:
    """The output shape when the axes input is not constant: only the rank may be known."""
    if data.shape is None:
        return None
    if desc.keepdims:
        # Each dim either stays or becomes 1; a known 1 stays 1 either way.
        return tuple(1 if d == 1 else None for d in data.shape)
    count = axes_info.shape[0] if axes_info.shape is not None and len(axes_info.shape) == 1 else None
    if isinstance(count, int) and count > 0:
        return (None,) * (len(data.shape) - count)
    return None


def _reduce_infer(name: str, allowed: frozenset[DataType]):
    def infer(desc: ReduceDescriptor, inputs, consts):
        data = inputs[0]
        expect_dtype(data, allowed, name)
        axes_info = inputs[1] if len(inputs) > 1 else None
        if axes_info is not None and desc.axes is None and consts[1] is None:
            return [TensorInfo(_unknown_axes_shape(desc, data, axes_info), data.dtype)]
        if data.shape is None:
            return [TensorInfo(None, data.dtype)]
        axes_input = const_ints(consts[1]) if axes_info is not None else None
        axes = reduce_axes(desc, len(data.shape), axes_input, name)
        return [TensorInfo(reduced_shape(data.shape, axes, bool(desc.keepdims)), data.dtype)]

    return infer


for _name, _allowed in REDUCE_DTYPES.items():
    layer_kind(_name, ReduceDescriptor, min_inputs=1, max_inputs=2)(_reduce_infer(_name, _allowed))


@attrs.frozen
class ArgReduceDescriptor:
    """ArgMax / ArgMin: the index (int64) of the extreme along ``axis``; ties go to the first
    index, or the last with ``select_last_index``."""

    axis: int = 0
    keepdims: int = attrs.field(default=1, validator=_FLAG)
    select_last_index: int = attrs.field(default=0, validator=_FLAG)


@layer_kind(["ArgMax", "ArgMin"], ArgReduceDescriptor)
def infer_arg_reduce(desc: ArgReduceDescriptor, inputs, consts):
    data = inputs[0]
    expect_dtype(data, NUMERIC_TYPES, "ArgMax/ArgMin")
    if data.shape is None:
        return [TensorInfo(None, DataType.INT64)]
    axis = normalize_axis(desc.axis, len(data.shape), "ArgMax/ArgMin")
    if data.shape[axis] == 0:
        raise ShapeError(f"ArgMax/ArgMin: axis {desc.axis} of shape {tuple(data.shape)} is empty")
    return [TensorInfo(reduced_shape(data.shape, (axis,), bool(desc.keepdims)), DataType.INT64)]
