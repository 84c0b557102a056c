"""Pooling kernels: MaxPool, AveragePool, LpPool and their global forms.

A windowed pool pads its input once and walks the kernel cells: each cell reads one strided
slice of the padded input (one value per output position) and folds it into the result, so
the Python loop runs kernel-size times, never per output pixel.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import numpy as np

from flowrt.engine.graph.layers.conv import WindowGeometry
from flowrt.engine.graph.layers.pooling import pool_geometry
from flowrt.types import DataType, static_dims
from flowrt.workers.cpu.ref.kernels import ref_kernel
from flowrt.workers.cpu.ref.kernels.conv import compute_dtype, pad_spatial, window_slices

_LEAD = (slice(None), slice(None))


def _windows(padded: np.ndarray, kernel: Sequence[int], geometry: WindowGeometry) -> Iterator[np.ndarray]:
    """For each kernel cell in row-major order, the (N, C, *out) slice of ``padded`` it reads."""
    for offset in np.ndindex(*kernel):
        yield padded[_LEAD + window_slices(offset, geometry)]


def _lowest(dtype: np.dtype) -> float | int:
    # By DataType: ml_dtypes' bfloat16 has numpy kind "V", not "f".
    return -np.inf if DataType.from_numpy(dtype).is_float else np.iinfo(dtype).min


@ref_kernel("MaxPool")
def max_pool(desc, x):
    geometry = pool_geometry(desc, x.shape[2:])
    kernel = desc.kernel_shape
    windows = _windows(pad_spatial(x, geometry, kernel, _lowest(x.dtype)), kernel, geometry)
    best = next(windows).copy()
    if desc.num_outputs == 1:
        for window in windows:
            np.maximum(best, window, out=best)
        return best
    cell = np.zeros(best.shape, dtype=np.int64)
    for i, window in enumerate(windows, start=1):
        # Strictly greater: ties keep the first cell in row-major order, as ONNX Runtime does.
        better = window > best
        np.copyto(best, window, where=better)
        cell[better] = i
    return best, _flat_indices(cell, x.shape, kernel, geometry, desc.storage_order)


def _flat_indices(
    cell: np.ndarray,
    shape: Sequence[int],
    kernel: Sequence[int],
    geometry: WindowGeometry,
    storage_order: int,
) -> np.ndarray:
    """Flat input indices of the chosen kernel cells: (n * C + c) * prod(spatial) + the spatial
    offset, row-major or (``storage_order`` 1) column-major over the spatial dims."""
    spatial = shape[2:]
    rank = len(spatial)
    cells = np.array(list(np.ndindex(*kernel)), dtype=np.int64).reshape(-1, rank)
    channel = np.arange(shape[0] * shape[1], dtype=np.int64).reshape(shape[0], shape[1], *([1] * rank))
    flat = channel * int(np.prod(spatial))
    for axis in range(rank):
        out = np.arange(cell.shape[2 + axis], dtype=np.int64) * geometry.strides[axis]
        out = out.reshape([-1 if a == axis else 1 for a in range(rank)]) - geometry.pads_begin[axis]
        coord = out + cells[cell, axis] * geometry.dilations[axis]
        dims = spatial[axis + 1 :] if storage_order == 0 else spatial[:axis]
        flat = flat + coord * int(np.prod(dims, dtype=np.int64))
    return flat


def _window_sums(x: np.ndarray, desc, geometry: WindowGeometry) -> np.ndarray:
    """The sum of each window, padding read as zeros."""
    kernel = desc.kernel_shape
    windows = _windows(pad_spatial(x, geometry, kernel, 0), kernel, geometry)
    total = next(windows).copy()
    for window in windows:
        total += window
    return total


def _window_counts(desc, spatial: Sequence[int], geometry: WindowGeometry) -> np.ndarray:
    """How many cells of each window AveragePool divides by: the input cells, plus the pad cells
    with ``count_include_pad`` (never the cells ceil mode reaches past the trailing pads)."""
    counts, out = np.ones((1, 1), dtype=np.int64), static_dims(geometry.out)
    for axis, size in enumerate(spatial):
        begin, end = geometry.pads_begin[axis], geometry.pads_end[axis]
        low, high = (0, begin + size + end) if desc.count_include_pad else (begin, begin + size)
        starts = np.arange(out[axis]) * geometry.strides[axis]
        cells = starts[:, None] + np.arange(desc.kernel_shape[axis]) * geometry.dilations[axis]
        per_axis = ((cells >= low) & (cells < high)).sum(axis=1)
        counts = np.multiply.outer(counts, per_axis)
    return counts


@ref_kernel("AveragePool")
def average_pool(desc, x):
    geometry = pool_geometry(desc, x.shape[2:])
    total = _window_sums(x.astype(compute_dtype(x.dtype), copy=False), desc, geometry)
    # A window that holds no counted cell (only possible with ceil mode) has no mean.
    counts = np.maximum(_window_counts(desc, x.shape[2:], geometry), 1)
    return (total / counts).astype(x.dtype, copy=False)


def _powered(x: np.ndarray, p: float) -> np.ndarray:
    x = x.astype(compute_dtype(x.dtype), copy=False)
    if p == 1:
        return np.abs(x)
    if p == 2:
        return x * x
    return np.power(np.abs(x), x.dtype.type(p))


def _root(total: np.ndarray, p: float, dtype: np.dtype) -> np.ndarray:
    root = np.sqrt(total) if p == 2 else total if p == 1 else np.power(total, total.dtype.type(1.0 / p))
    return root.astype(dtype, copy=False)


@ref_kernel("LpPool")
def lp_pool(desc, x):
    geometry = pool_geometry(desc, x.shape[2:])
    return _root(_window_sums(_powered(x, desc.p), desc, geometry), desc.p, x.dtype)


def _spatial_axes(x: np.ndarray) -> tuple[int, ...]:
    return tuple(range(2, x.ndim))


@ref_kernel("GlobalAveragePool")
def global_average_pool(desc, x):
    mean = x.mean(axis=_spatial_axes(x), keepdims=True, dtype=compute_dtype(x.dtype))
    return mean.astype(x.dtype, copy=False)


@ref_kernel("GlobalMaxPool")
def global_max_pool(desc, x):
    return x.max(axis=_spatial_axes(x), keepdims=True)


@ref_kernel("GlobalLpPool")
def global_lp_pool(desc, x):
    total = _powered(x, desc.p).sum(axis=_spatial_axes(x), keepdims=True)
    return _root(total, desc.p, x.dtype)
