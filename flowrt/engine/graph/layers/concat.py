"""Concat and Split: joining tensors along an axis, and cutting one into pieces along it."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, overload

import attrs

from flowrt.engine.graph.layer_kind import as_tuple, layer_kind
from flowrt.engine.graph.layers.reshape import const_ints
from flowrt.engine.graph.shapes import normalize_axis
from flowrt.errors import DataTypeError, ShapeError
from flowrt.types import Dim, TensorInfo


@attrs.frozen
class ConcatDescriptor:
    """Concat along ``axis`` (negative counts from the end); before opset 4 it defaults to 1."""

    axis: int | None = None
    opset: int = 22

    def __attrs_post_init__(self) -> None:
        if self.axis is None and self.opset >= 4:
            raise ValueError(
                f"Concat needs the 'axis' attribute from opset 4, this model is opset {self.opset}"
            )

    @property
    def concat_axis(self) -> int:
        return 1 if self.axis is None else self.axis


def _merge_dim(dims: Sequence[Dim], axis: int, where: str) -> Dim:
    """One dim that every input must share: the known int, else the one symbol named, else None."""
    known = {d for d in dims if isinstance(d, int)}
    if len(known) > 1:
        raise ShapeError(f"{where}: inputs must agree on dim {axis}, got {sorted(known)}")
    if known:
        return known.pop()
    names = {d for d in dims if d is not None}
    return names.pop() if len(names) == 1 else None


@layer_kind("Concat", ConcatDescriptor, min_inputs=1, max_inputs=None)
def infer_concat(desc: ConcatDescriptor, inputs, consts):
    dtype = inputs[0].dtype
    if any(i.dtype != dtype for i in inputs):
        found = ", ".join(i.dtype.name.lower() for i in inputs)
        raise DataTypeError(f"Concat: inputs of one data type expected, got {found}")
    shapes = [i.shape for i in inputs if i.shape is not None]
    if not shapes:
        return [TensorInfo(None, dtype)]
    rank = len(shapes[0])
    if any(len(s) != rank for s in shapes):
        found = ", ".join(i.format_shape() for i in inputs)
        raise ShapeError(f"Concat: inputs of one rank expected, got {found}")
    axis = normalize_axis(desc.concat_axis, rank, "Concat")
    sizes = [None if i.shape is None else i.shape[axis] for i in inputs]
    known = [d for d in sizes if isinstance(d, int)]
    total = sum(known) if len(known) == len(sizes) else None
    out = [total if i == axis else _merge_dim([s[i] for s in shapes], i, "Concat") for i in range(rank)]
    return [TensorInfo(tuple(out), dtype)]


@attrs.frozen
class SplitDescriptor:
    """Split along ``axis`` into ``num_outputs`` pieces whose lengths are ``split`` (an attribute
    before opset 13, the second input after) or, when not given, as equal as can be (the last
    piece smaller, as opset 18 says)."""

    axis: int = 0
    split: tuple[int, ...] | None = attrs.field(default=None, converter=as_tuple)
    num_outputs: int = attrs.field(default=1, validator=attrs.validators.gt(0))


def split_lengths(dim: int, count: int) -> list[int]:
    """Lengths of ``count`` pieces of ``dim``: ceil(dim / count) each, the last one what remains."""
    if dim % count == 0:
        return [dim // count] * count
    piece = dim // count + 1
    last = dim - piece * (count - 1)
    if last < 0:
        raise ShapeError(f"Split: cannot cut a dim of {dim} into {count} pieces of at most {piece}")
    return [piece] * (count - 1) + [last]


@overload
def resolve_split(desc: SplitDescriptor, split: Sequence[int] | None, dim: int) -> list[int]: ...
@overload
def resolve_split(desc: SplitDescriptor, split: Sequence[int] | None, dim: Dim) -> list[Dim]: ...
def resolve_split(desc: SplitDescriptor, split: Sequence[int] | None, dim: Dim) -> list[Any]:
    """The length of each output along the axis (None where unknown: only where ``dim`` is);
    ShapeError on a conflict.

    ``split`` is the lengths from the input or attribute; None or empty means equal pieces.
    """
    if not split and desc.split:
        split = desc.split
    if split:
        if len(split) != desc.num_outputs:
            raise ShapeError(f"Split: {desc.num_outputs} split lengths expected, got {list(split)}")
        if isinstance(dim, int) and sum(split) != dim:
            raise ShapeError(f"Split: split lengths {list(split)} must sum to the axis dim {dim}")
        return list(split)
    if not isinstance(dim, int):
        return [None] * desc.num_outputs
    return list(split_lengths(dim, desc.num_outputs))


@layer_kind("Split", SplitDescriptor, min_inputs=1, max_inputs=2, num_outputs=None)
def infer_split(desc: SplitDescriptor, inputs, consts):
    data = inputs[0]
    given = len(inputs) > 1 and inputs[1] is not None
    split = const_ints(consts[1]) if given else None
    if data.shape is None:
        return [TensorInfo(None, data.dtype)] * desc.num_outputs
    axis = normalize_axis(desc.axis, len(data.shape), "Split")
    if given and split is None:
        lengths: list[Dim] = [None] * desc.num_outputs
    else:
        lengths = resolve_split(desc, split, data.shape[axis])
    return [TensorInfo(data.shape[:axis] + (n,) + data.shape[axis + 1 :], data.dtype) for n in lengths]
