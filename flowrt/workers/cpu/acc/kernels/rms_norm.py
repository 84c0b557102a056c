"""RMSNormalization: each row (the dims from ``axis`` on) divided by its root mean square and
scaled, rows split across workers when there are enough of them.

The rows are walked in flat float32 arrays with int64 bounds, so one compiled specialization
serves every shape.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from flowrt.engine.scheduler.window import SplitHint, split_bounds
from flowrt.registry import Support, WorkloadInfo
from flowrt.types import DataType
from flowrt.workers.cpu.acc.kernels import acc_kernel, float32_data
from flowrt.workers.cpu.acc.kernels.row_sums import row_sum_of_squares

# Below this many elements per slice, a second thread costs more than it saves.
MIN_SLICE = 16384


@njit(nogil=True, cache=True)
def _rms_rows(x, out, first, stop, length, scale, epsilon):
    for r in range(first, stop):
        start = r * length
        # The sum of squares in float64; the mean square itself in float32, as CpuRef keeps it.
        total = row_sum_of_squares(x[start : start + length], np.float32(0))
        # One reciprocal per row, then multiplies: within an ulp of CpuRef's division.
        inv = np.float32(1) / np.sqrt(np.float32(total / length) + epsilon)
        for i in range(length):
            k = np.uint64(start + i)
            out[k] = x[k] * inv * scale[np.uint64(i)]


@njit(parallel=True, nogil=True, cache=True)
def _rms_slices(x, out, bounds, length, scale, epsilon):
    for s in prange(bounds.shape[0] - 1):
        _rms_rows(x, out, bounds[s], bounds[s + 1], length, scale, epsilon)


@acc_kernel("RMSNormalization")
class RMSNormalizationKernel:
    """RMSNormalization over the dims from ``axis`` on, float32; one row per iteration of the
    window, with no parallel region when one slice holds them all."""

    split_hint = SplitHint(axis=0, min_slice=1)

    @classmethod
    def supports(cls, info: WorkloadInfo) -> Support:
        scale = info.inputs[1] if len(info.inputs) > 1 else None
        if scale is None or scale.dtype is not DataType.FLOAT32:
            return Support.no("CpuAcc RMSNormalization takes a float32 scale only")
        return float32_data(info)

    def __init__(self, info: WorkloadInfo, workers: int) -> None:
        self.info = info
        self.workers = workers
        self.epsilon = np.float32(info.descriptor.epsilon)
        self.constant = len(info.constants) > 1 and info.constants[1] is not None
        self._scales: dict[tuple[int, ...], np.ndarray] = {}
        self._bounds: dict[tuple[int, int], np.ndarray] = {}

    def scale(self, scale: np.ndarray, normalized: tuple[int, ...]) -> np.ndarray:
        """The scale broadcast to the normalized dims, flat float32 (kept when constant)."""
        cached = self._scales.get(normalized)
        if cached is None:
            cached = np.ascontiguousarray(np.broadcast_to(scale, normalized), np.float32).reshape(-1)
            if self.constant:
                self._scales[normalized] = cached
        return cached

    def bounds(self, rows: int, length: int) -> np.ndarray:
        """Row slice boundaries, each slice at least ``MIN_SLICE`` elements (once per shape)."""
        key = (rows, length)
        cached = self._bounds.get(key)
        if cached is None:
            hint = SplitHint(0, max(1, MIN_SLICE // max(1, length)))
            cached = self._bounds[key] = split_bounds(rows, hint, self.workers)
        return cached

    def execute(self, inputs, outputs=None):
        x = np.ascontiguousarray(inputs[0])
        out = np.empty_like(x) if outputs is None else outputs[0]
        axis = self.info.descriptor.axis % x.ndim
        rows = int(np.prod(x.shape[:axis], dtype=np.int64))
        length = int(np.prod(x.shape[axis:], dtype=np.int64))
        if x.size:
            scale = self.scale(inputs[1], x.shape[axis:])
            flat, dst = x.reshape(-1), out.reshape(-1)
            bounds = self.bounds(rows, length)
            if bounds.shape[0] == 2:
                _rms_rows(flat, dst, 0, rows, length, scale, self.epsilon)
            else:
                _rms_slices(flat, dst, bounds, length, scale, self.epsilon)
        return [out]
