"""Slice, Gather, GatherElements and GatherND: layers that pick parts of a tensor."""

from __future__ import annotations

from collections.abc import Sequence

import attrs

from flowrt.engine.graph.layer_kind import as_tuple, layer_kind
from flowrt.engine.graph.layers.reshape import const_ints
from flowrt.engine.graph.shapes import normalize_axis
from flowrt.errors import DataTypeError, ShapeError
from flowrt.types import DataType, Dim, TensorInfo

_INDEX_TYPES = (DataType.INT32, DataType.INT64)


@attrs.frozen
class SliceDescriptor:
    """Slice: ``starts``/``ends``/``axes`` are attributes before opset 10; from opset 10 they
    and ``steps`` are inputs. Indices out of range are clamped, negative ones count from the end."""

    starts: tuple[int, ...] | None = attrs.field(default=None, converter=as_tuple)
    ends: tuple[int, ...] | None = attrs.field(default=None, converter=as_tuple)
    axes: tuple[int, ...] | None = attrs.field(default=None, converter=as_tuple)


def slice_params(desc: SliceDescriptor, values: Sequence[Sequence[int] | None]) -> list | None:
    """(starts, ends, axes, steps) from the attributes or from the values of inputs 1..4.

    ``values`` holds the known values of inputs 1..4 (None when absent or unknown). Returns
    None when starts or ends are not known.
    """
    values = list(values) + [None] * (4 - len(values))
    starts: Sequence[int] | None
    ends: Sequence[int] | None
    given_axes: Sequence[int] | None
    given_steps: Sequence[int] | None
    if desc.starts is not None:
        starts, ends, given_axes, given_steps = list(desc.starts), list(desc.ends or ()), desc.axes, None
    else:
        starts, ends, given_axes, given_steps = values
    if starts is None or ends is None:
        return None
    axes = list(range(len(starts))) if not given_axes else list(given_axes)
    steps = [1] * len(starts) if not given_steps else list(given_steps)
    if not len(starts) == len(ends) == len(axes) == len(steps):
        raise ShapeError(
            f"Slice: starts, ends, axes and steps of one length expected, got {starts}, {ends}, {axes}, {steps}"
        )
    if 0 in steps:
        raise ShapeError(f"Slice: steps may not be 0, got {steps}")
    return [starts, ends, axes, steps]


def sliced_length(dim: Dim, start: int, end: int, step: int) -> Dim:
    """Length of dim[start:end:step] with ONNX's clamping, which is Python's."""
    if isinstance(dim, int):
        return len(range(*slice(start, end, step).indices(dim)))
    # A whole-axis slice keeps even an unknown dim.
    return dim if (start == 0 and step == 1 and end >= 2**31 - 1) else None


@layer_kind("Slice", SliceDescriptor, min_inputs=1, max_inputs=5)
def infer_slice(desc: SliceDescriptor, inputs, consts):
    data = inputs[0]
    if data.shape is None:
        return [TensorInfo(None, data.dtype)]
    rank = len(data.shape)
    given = [i < len(inputs) and inputs[i] is not None for i in range(5)]
    values = [const_ints(consts[i]) if given[i] else None for i in range(1, 5)]
    if desc.starts is None and any(g and v is None for g, v in zip(given[1:], values, strict=True)):
        return [TensorInfo(_unknown_slice_shape(data.shape, values[2] if given[3] else None), data.dtype)]
    params = slice_params(desc, values)
    if params is None:
        raise ShapeError(
            "Slice: starts and ends expected (attributes before opset 10, inputs after), found none"
        )
    out = list(data.shape)
    starts, ends, axes, steps = params
    norm = [normalize_axis(a, rank, "Slice") for a in axes]
    if len(set(norm)) != len(norm):
        raise ShapeError(f"Slice: axes must be unique, got {axes}")
    for s, e, a, st in zip(starts, ends, norm, steps, strict=True):
        out[a] = sliced_length(data.shape[a], s, e, st)
    return [TensorInfo(tuple(out), data.dtype)]


def _unknown_slice_shape(shape: tuple[Dim, ...], axes: list[int] | None) -> tuple[Dim, ...]:
    """Dims of the slice when starts, ends or steps are not known: the sliced ones are None."""
    if not axes:
        return (None,) * len(shape)
    chosen = {normalize_axis(a, len(shape), "Slice") for a in axes}
    return tuple(None if i in chosen else d for i, d in enumerate(shape))


@attrs.frozen
class GatherDescriptor:
    """Gather / GatherElements: pick along ``axis`` by index (negative indices count from the end)."""

    axis: int = 0


def _check_indices(info: TensorInfo, op: str) -> None:
    if info.dtype not in _INDEX_TYPES:
        raise DataTypeError(f"{op}: int32 or int64 indices expected, got {info.dtype.name.lower()}")


@layer_kind("Gather", GatherDescriptor, min_inputs=2, max_inputs=2)
def infer_gather(desc: GatherDescriptor, inputs, consts):
    data, indices = inputs
    _check_indices(indices, "Gather")
    if data.shape is None or indices.shape is None:
        return [TensorInfo(None, data.dtype)]
    axis = normalize_axis(desc.axis, len(data.shape), "Gather")
    return [TensorInfo(data.shape[:axis] + indices.shape + data.shape[axis + 1 :], data.dtype)]


@layer_kind("GatherElements", GatherDescriptor, min_inputs=2, max_inputs=2)
def infer_gather_elements(desc: GatherDescriptor, inputs, consts):
    data, indices = inputs
    _check_indices(indices, "GatherElements")
    if data.shape is not None and indices.shape is not None:
        if len(data.shape) != len(indices.shape):
            raise ShapeError(
                f"GatherElements: indices of the data's rank {len(data.shape)} expected, got {indices.format_shape()}"
            )
        normalize_axis(desc.axis, len(data.shape), "GatherElements")
    return [TensorInfo(indices.shape, data.dtype)]


@attrs.frozen
class GatherNDDescriptor:
    """GatherND: the last dim of indices addresses that many leading dims of data, after
    ``batch_dims`` leading dims shared by data and indices."""

    batch_dims: int = attrs.field(default=0, validator=attrs.validators.ge(0))


@layer_kind("GatherND", GatherNDDescriptor, min_inputs=2, max_inputs=2)
def infer_gather_nd(desc: GatherNDDescriptor, inputs, consts):
    data, indices = inputs
    _check_indices(indices, "GatherND")
    if data.shape is None or indices.shape is None or not isinstance(indices.shape[-1], int):
        return [TensorInfo(None, data.dtype)]
    b, k = desc.batch_dims, indices.shape[-1]
    if b >= min(len(data.shape), len(indices.shape)) or b + k > len(data.shape):
        raise ShapeError(
            f"GatherND: indices {indices.format_shape()} with batch_dims={b} do not fit data {data.format_shape()}"
        )
    return [TensorInfo(indices.shape[:-1] + data.shape[b + k :], data.dtype)]
