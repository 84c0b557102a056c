"""TensorScatter (opset 24): a KV cache with each batch entry's update written in at its own
position along the sequence axis."""

from __future__ import annotations

import attrs

from flowrt.engine.graph.layer_kind import layer_kind
from flowrt.engine.graph.layers.detection import expect_dims
from flowrt.engine.graph.layers.elementwise import expect_dtype, expect_same_dtype
from flowrt.engine.graph.shapes import normalize_axis
from flowrt.errors import ShapeError
from flowrt.types import DataType, TensorInfo

MODES = ("linear", "circular")


@attrs.frozen
class TensorScatterDescriptor:
    """TensorScatter: a copy of ``past_cache`` where, for batch entry ``b``, the update's
    positions along ``axis`` (the sequence axis; never the batch axis 0) go to the cache's
    positions from ``write_indices[b]`` (absent: 0) on; ``mode`` "circular" wraps them around
    the cache's length, "linear" needs them to fit."""

    mode: str = attrs.field(default="linear", validator=attrs.validators.in_(MODES))
    axis: int = -2


def sequence_axis(desc: TensorScatterDescriptor, rank: int) -> int:
    """The non-negative sequence axis of a cache of ``rank``; ShapeError when out of range or
    the batch axis."""
    axis = normalize_axis(desc.axis, rank, "TensorScatter")
    if axis == 0:
        raise ShapeError(
            f"TensorScatter: axis {desc.axis} is the batch axis; a sequence axis of 1 or more expected"
        )
    return axis


def _check_update(desc: TensorScatterDescriptor, cache: TensorInfo, update: TensorInfo) -> None:
    if cache.shape is None:
        return
    axis = sequence_axis(desc, len(cache.shape))
    expected = tuple(None if i == axis else d for i, d in enumerate(cache.shape))
    expect_dims(update, expected, "update (the cache's shape but along the sequence axis)", "TensorScatter")
    if update.shape is None:
        return
    length, room = update.shape[axis], cache.shape[axis]
    if isinstance(length, int) and isinstance(room, int) and length > room:
        raise ShapeError(
            f"TensorScatter: an update of at most the cache's {room} positions along axis {axis} "
            f"expected, got {length} ({update.format_shape()})"
        )


@layer_kind("TensorScatter", TensorScatterDescriptor, min_inputs=2, max_inputs=3)
def infer_tensor_scatter(desc: TensorScatterDescriptor, inputs, consts):
    cache, update = inputs[0], inputs[1]
    write_indices = inputs[2] if len(inputs) > 2 else None
    expect_same_dtype([cache, update], "TensorScatter past_cache and update")
    _check_update(desc, cache, update)
    if write_indices is not None:
        expect_dtype(write_indices, frozenset({DataType.INT64}), "TensorScatter input write_indices")
        batch = cache.shape[0] if cache.shape is not None else None
        expect_dims(write_indices, (batch,), "write_indices [batch]", "TensorScatter")
    return [cache]
