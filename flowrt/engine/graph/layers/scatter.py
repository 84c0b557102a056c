"""ScatterElements, ScatterND and the legacy Scatter: a copy of the data with some elements
replaced by (or combined with) updates at given indices."""

from __future__ import annotations

import attrs

from flowrt.engine.graph.layer_kind import layer_kind
from flowrt.engine.graph.layers.elementwise import expect_same_dtype
from flowrt.engine.graph.shapes import normalize_axis
from flowrt.errors import DataTypeError, ShapeError
from flowrt.types import DataType, Dim, TensorInfo

_INDEX_TYPES = (DataType.INT32, DataType.INT64)
REDUCTIONS = ("none", "add", "mul", "max", "min")
_reduction_field = attrs.field(default="none", validator=attrs.validators.in_(REDUCTIONS))


@attrs.frozen
class ScatterElementsDescriptor:
    """ScatterElements: ``updates[i, j, ...]`` goes to the data position whose ``axis`` index is
    ``indices[i, j, ...]`` (negative counts from the end) and whose other indices are its own;
    ``reduction`` combines it with what is there (``none``: replace; opset 16 on)."""

    axis: int = 0
    reduction: str = _reduction_field


@attrs.frozen
class ScatterDescriptor:
    """Scatter (opsets 9-10): ScatterElements without a reduction."""

    axis: int = 0


@attrs.frozen
class ScatterNDDescriptor:
    """ScatterND: each index tuple, the last dim of ``indices``, addresses a slice of the data
    that the matching slice of ``updates`` replaces or is combined with by ``reduction``."""

    reduction: str = _reduction_field


def _check_types(data: TensorInfo, indices: TensorInfo, updates: TensorInfo) -> None:
    if indices.dtype not in _INDEX_TYPES:
        raise DataTypeError(f"int32 or int64 indices expected, got {indices.dtype.name.lower()}")
    expect_same_dtype([data, updates], "data and updates")


def _dims_conflict(a: Dim, b: Dim) -> bool:
    return isinstance(a, int) and isinstance(b, int) and a != b


def infer_scatter_elements(desc, inputs, consts):
    """Output info of ScatterElements and Scatter: the data's; ShapeError when indices and
    updates differ in shape or are not of the data's rank."""
    data, indices, updates = inputs
    _check_types(data, indices, updates)
    if indices.shape is not None and updates.shape is not None:
        if len(indices.shape) != len(updates.shape) or any(map(_dims_conflict, indices.shape, updates.shape)):
            raise ShapeError(
                f"indices and updates of one shape expected, got {indices.format_shape()} and {updates.format_shape()}"
            )
    if data.shape is not None and indices.shape is not None:
        if len(indices.shape) != len(data.shape):
            raise ShapeError(
                f"indices of the data's rank {len(data.shape)} expected, got {indices.format_shape()}"
            )
        normalize_axis(desc.axis, len(data.shape), "scatter")
    return [data]


layer_kind("ScatterElements", ScatterElementsDescriptor, min_inputs=3, max_inputs=3)(infer_scatter_elements)
layer_kind("Scatter", ScatterDescriptor, min_inputs=3, max_inputs=3)(infer_scatter_elements)


@layer_kind("ScatterND", ScatterNDDescriptor, min_inputs=3, max_inputs=3)
def infer_scatter_nd(desc: ScatterNDDescriptor, inputs, consts):
    data, indices, updates = inputs
    _check_types(data, indices, updates)
    if indices.shape == ():
        raise ShapeError("ScatterND: indices of rank 1 or more expected, got a scalar")
    if data.shape is None or indices.shape is None or not isinstance(indices.shape[-1], int):
        return [data]
    k = indices.shape[-1]
    if k > len(data.shape):
        raise ShapeError(
            f"ScatterND: index tuples of at most {len(data.shape)} values expected, got indices {indices.format_shape()}"
        )
    expected = indices.shape[:-1] + data.shape[k:]
    if updates.shape is not None and (
        len(updates.shape) != len(expected) or any(map(_dims_conflict, updates.shape, expected))
    ):
        shown = TensorInfo(expected).format_shape()
        raise ShapeError(f"ScatterND: updates of shape {shown} expected, got {updates.format_shape()}")
    return [data]
