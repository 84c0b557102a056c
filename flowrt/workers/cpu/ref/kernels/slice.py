"""Slice, Gather, GatherElements and GatherND kernels."""

from __future__ import annotations

import numpy as np

from flowrt.engine.graph.layers.reshape import const_ints
from flowrt.engine.graph.layers.slice import slice_params
from flowrt.workers.cpu.ref.kernels import ref_kernel


@ref_kernel("Slice")
def slice_(desc, data, starts=None, ends=None, axes=None, steps=None):
    starts, ends, axes, steps = slice_params(desc, [const_ints(v) for v in (starts, ends, axes, steps)])
    index = [slice(None)] * data.ndim
    for s, e, a, st in zip(starts, ends, axes, steps, strict=True):
        index[a] = slice(s, e, st)  # Python's clamping is ONNX's
    return data[tuple(index)]


def _wrap(indices: np.ndarray, dim: int) -> np.ndarray:
    """Negative indices made positive, as int64."""
    indices = indices.astype(np.int64, copy=False)
    return np.where(indices < 0, indices + dim, indices)


@ref_kernel("Gather")
def gather(desc, data, indices):
    axis = desc.axis % data.ndim
    return np.take(data, _wrap(indices, data.shape[axis]), axis=axis)


@ref_kernel("GatherElements")
def gather_elements(desc, data, indices):
    axis = desc.axis % data.ndim
    # Indices may be shorter than the data on the other axes: cut the data to their extent.
    window = tuple(slice(None) if i == axis else slice(0, n) for i, n in enumerate(indices.shape))
    return np.take_along_axis(data[window], _wrap(indices, data.shape[axis]), axis=axis)


@ref_kernel("GatherND")
def gather_nd(desc, data, indices):
    b = desc.batch_dims
    k = indices.shape[-1]
    batch = int(np.prod(data.shape[:b], dtype=np.int64))
    flat_data = data.reshape((batch,) + data.shape[b:])
    flat_idx = _wrap(indices.reshape(batch, -1, k), np.array(data.shape[b : b + k], dtype=np.int64))
    rows = np.arange(batch)[:, None]
    picked = flat_data[(rows, *(flat_idx[..., j] for j in range(k)))]
    return picked.reshape(indices.shape[:-1] + data.shape[b + k :])
