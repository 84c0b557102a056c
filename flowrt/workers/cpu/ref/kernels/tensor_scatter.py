"""TensorScatter kernel."""

from __future__ import annotations

import numpy as np

from flowrt.engine.graph.layers.tensor_scatter import sequence_axis
from flowrt.errors import ShapeError
from flowrt.workers.cpu.ref.kernels import ref_kernel


def _check_shapes(cache: np.ndarray, update: np.ndarray, axis: int) -> None:
    expected = cache.shape[:axis] + (update.shape[axis],) + cache.shape[axis + 1 :]
    if update.ndim != cache.ndim or update.shape != expected or update.shape[axis] > cache.shape[axis]:
        raise ShapeError(
            f"TensorScatter: an update of the cache's shape {cache.shape} but for at most "
            f"{cache.shape[axis]} positions along axis {axis} expected, got {update.shape}"
        )


def _starts(write_indices: np.ndarray | None, batch: int, room: int, length: int, linear: bool) -> np.ndarray:
    """Each batch entry's first write position; ShapeError when a linear write does not fit."""
    if write_indices is None:
        return np.zeros(batch, np.int64)
    if write_indices.shape != (batch,):
        raise ShapeError(
            f"TensorScatter: write_indices of shape ({batch},) expected, got {write_indices.shape}"
        )
    if linear and batch and (write_indices.min() < 0 or write_indices.max() + length > room):
        raise ShapeError(
            f"TensorScatter: linear mode needs write_indices in [0, {room - length}] so that "
            f"{length} positions fit in the cache's {room}, got values from "
            f"{write_indices.min()} to {write_indices.max()}"
        )
    return write_indices


@ref_kernel("TensorScatter")
def tensor_scatter(desc, past_cache, update, write_indices=None):
    axis = sequence_axis(desc, past_cache.ndim)
    _check_shapes(past_cache, update, axis)
    room, length = past_cache.shape[axis], update.shape[axis]
    starts = _starts(write_indices, past_cache.shape[0], room, length, desc.mode == "linear")
    present = past_cache.copy()
    # Per batch entry, one fancy index along the sequence axis (axis - 1 once the entry is taken).
    lead = (slice(None),) * (axis - 1)
    for b, start in enumerate(starts):
        positions = int(start) + np.arange(length)
        if desc.mode == "circular":
            positions %= room
        present[b][(*lead, positions)] = update[b]
    return present
