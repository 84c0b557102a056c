"""GlobalAveragePool and GlobalMaxPool: one value per (N, C) plane, whole planes per slice.

GlobalAveragePool adds in numpy's pairwise order, bit for bit what CpuRef's ``np.mean`` does.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from flowrt.engine.scheduler.window import SplitHint
from flowrt.registry import Support, WorkloadInfo
from flowrt.workers.cpu.acc.kernels import acc_kernel, float32_data
from flowrt.workers.cpu.acc.kernels.pooling import plane_bounds


@njit(nogil=True, cache=True)
def _block_sum(a, first, n):
    """numpy's pairwise sum of a block of at most 128 values: eight lanes, then the rest."""
    if n < 8:
        res = np.float32(0)
        for i in range(first, first + n):
            res += a[i]
        return res
    lanes = a[first : first + 8].copy()
    i = 8
    while i < n - n % 8:
        for j in range(8):
            lanes[j] += a[first + i + j]
        i += 8
    res = ((lanes[0] + lanes[1]) + (lanes[2] + lanes[3])) + ((lanes[4] + lanes[5]) + (lanes[6] + lanes[7]))
    for k in range(first + i, first + n):
        res += a[k]
    return res


@njit(nogil=True, cache=True)
def pairwise_sum(a, first, n):
    """The float32 sum of ``a[first : first + n]`` in numpy's pairwise order.

    Bit for bit what CpuRef's ``np.mean`` adds: a plane of near-equal values (a classifier's
    last pooling) must pool to equal values, or the softmax after it amplifies one ulp.
    numpy halves the range (on a multiple of 8) down to blocks of 128; the recursion runs
    here on an explicit stack, since numba cannot call a recursive function from a parallel
    region.
    """
    if n <= 128:
        return _block_sum(a, first, n)
    # Nodes (first, n, halved) still to visit, and the sums of the ranges done.
    nodes = np.empty((128, 3), np.int64)
    sums = np.empty(128, np.float32)
    nodes[0, 0], nodes[0, 1], nodes[0, 2] = first, n, 0
    top, done = 1, 0
    while top:
        top -= 1
        start, size, halved = nodes[top, 0], nodes[top, 1], nodes[top, 2]
        if size <= 128:
            sums[done] = _block_sum(a, start, size)
            done += 1
        elif halved:
            done -= 1
            sums[done - 1] += sums[done]
        else:
            half = size // 2
            half -= half % 8
            nodes[top, 2] = 1
            nodes[top + 1, 0], nodes[top + 1, 1], nodes[top + 1, 2] = start + half, size - half, 0
            nodes[top + 2, 0], nodes[top + 2, 1], nodes[top + 2, 2] = start, half, 0
            top += 3
    return sums[0]


@njit(parallel=True, nogil=True, cache=True)
def _global_average_pool(x, out, bounds):
    size = x.shape[1]
    for s in prange(bounds.shape[0] - 1):
        for p in range(bounds[s], bounds[s + 1]):
            out[p] = pairwise_sum(x[p], 0, size) / np.float32(size)


@njit(parallel=True, nogil=True, cache=True)
def _global_max_pool(x, out, bounds):
    for s in prange(bounds.shape[0] - 1):
        for p in range(bounds[s], bounds[s + 1]):
            best = x[p, 0]
            for i in range(1, x.shape[1]):
                v = x[p, i]
                if v > best or v != v:
                    best = v
            out[p] = best


class _GlobalPool:
    """One value per (N, C) plane, any number of spatial dims, planes split across workers."""

    split_hint = SplitHint(axis=0, min_slice=1)
    reduce = staticmethod(_global_average_pool)

    @classmethod
    def supports(cls, info: WorkloadInfo) -> Support:
        return float32_data(info)

    def __init__(self, info: WorkloadInfo, workers: int) -> None:
        self.info = info
        self.workers = workers
        self._bounds: dict[tuple[int, int], np.ndarray] = {}

    def execute(self, inputs, outputs=None):
        x = np.ascontiguousarray(inputs[0])
        n, c = x.shape[:2]
        out = np.empty((n, c) + (1,) * (x.ndim - 2), np.float32) if outputs is None else outputs[0]
        planes = x.reshape(n * c, -1)
        key = planes.shape
        bounds = self._bounds.get(key)
        if bounds is None:
            bounds = self._bounds[key] = plane_bounds(key[0], key[1], self.workers)
        if planes.shape[1] == 0:
            # An empty plane has no max; its mean is NaN, as numpy has it.
            out.fill(np.nan)
        else:
            self.reduce(planes, out.reshape(-1), bounds)
        return [out]


@acc_kernel("GlobalAveragePool")
class GlobalAveragePoolKernel(_GlobalPool):
    """The mean of each (N, C) plane."""

    reduce = staticmethod(_global_average_pool)


@acc_kernel("GlobalMaxPool")
class GlobalMaxPoolKernel(_GlobalPool):
    """The largest value of each (N, C) plane."""

    reduce = staticmethod(_global_max_pool)
