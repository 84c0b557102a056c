"""Tile and Expand: layers that repeat a tensor's data to a larger shape."""

from __future__ import annotations

from flowrt.engine.graph.layer_kind import NoDescriptor, layer_kind
from flowrt.engine.graph.layers.reshape import const_ints
from flowrt.engine.graph.shapes import broadcast_shapes, normalize_axis
from flowrt.errors import ShapeError
from flowrt.types import Dim, TensorInfo


def tile_repeats(rank: int, repeats: list[int], axis: int | None = None) -> list[int]:
    """Repeats per dim: ``repeats`` as given (opset 6+), or one count on ``axis`` (opset 1's
    Tile(input, tiles, axis)); ShapeError when they do not fit the rank."""
    if axis is not None:
        if len(repeats) != 1:
            raise ShapeError(f"Tile: one tile count expected with an axis input, got {repeats}")
        counts = [1] * rank
        counts[normalize_axis(axis, rank, "Tile")] = repeats[0]
        return counts
    if len(repeats) != rank:
        raise ShapeError(f"Tile: {rank} repeats expected for a rank-{rank} input, got {repeats}")
    if any(r < 0 for r in repeats):
        raise ShapeError(f"Tile: repeats must be >= 0, got {repeats}")
    return repeats


def _times(d: Dim, r: int) -> Dim:
    """A dim repeated r times; an unknown dim stays itself once and becomes 0 no times."""
    if r in (0, 1):
        return d if r == 1 else 0
    return d * r if isinstance(d, int) else None


@layer_kind("Tile", NoDescriptor, min_inputs=2, max_inputs=3)
def infer_tile(desc, inputs, consts):
    data = inputs[0]
    repeats = const_ints(consts[1])
    legacy = len(inputs) > 2 and inputs[2] is not None
    axis = const_ints(consts[2]) if legacy else None
    if data.shape is None:
        rank = len(repeats) if repeats is not None and not legacy else None
        return [TensorInfo(None if rank is None else (None,) * rank, data.dtype)]
    if repeats is None or (legacy and axis is None):
        return [TensorInfo((None,) * len(data.shape), data.dtype)]
    counts = tile_repeats(len(data.shape), repeats, axis[0] if axis else None)
    return [TensorInfo(tuple(_times(d, r) for d, r in zip(data.shape, counts, strict=True)), data.dtype)]


@layer_kind("Expand", NoDescriptor, min_inputs=2, max_inputs=2)
def infer_expand(desc, inputs, consts):
    data, shape_info = inputs
    target = const_ints(consts[1])
    if target is None:
        length = shape_info.shape[0] if shape_info.shape is not None and len(shape_info.shape) == 1 else None
        if data.shape is None or not isinstance(length, int):
            return [TensorInfo(None, data.dtype)]
        return [TensorInfo((None,) * max(length, len(data.shape)), data.dtype)]
    if data.shape is None:
        return [TensorInfo(None, data.dtype)]
    # Bidirectional: a 1 in the target keeps the input's dim, and the input's 1s take the target's.
    return [TensorInfo(broadcast_shapes(data.shape, target, where="Expand"), data.dtype)]
