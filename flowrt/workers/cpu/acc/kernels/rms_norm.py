"""RMSNormalization: each row (the dims from ``axis`` on) divided by its root mean square and
scaled, rows split across workers when there are enough of them.

The rows are walked in flat float32 arrays with int64 bounds, so one compiled specialization
serves every shape.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from flowrt.engine.scheduler.window import SplitHint, split_bounds
from flowrt.registry import Support, WorkloadInfo
from flowrt.types import DataType
from flowrt.workers.cpu.acc.calls import SliceFunction
from flowrt.workers.cpu.acc.kernels import acc_kernel, float32_data
from flowrt.workers.cpu.acc.kernels.activation import MIN_SLICE
from flowrt.workers.cpu.acc.kernels.row_sums import row_sum_of_squares


@njit(nogil=True, cache=True)
def _rms_rows(task, step, x, out, bounds, length, scale, epsilon):
    """The rows of slice ``task`` (a :class:`SliceFunction`)."""
    for r in range(bounds[task], bounds[task + 1]):
        start = r * length
        # The sum of squares in float64; the mean square itself in float32, as CpuRef keeps it.
        total = row_sum_of_squares(x[start : start + length], np.float32(0))
        # One reciprocal per row, then multiplies: within an ulp of CpuRef's division.
        inv = np.float32(1) / np.sqrt(np.float32(total / length) + epsilon)
        for i in range(length):
            k = np.uint64(start + i)
            out[k] = x[k] * inv * scale[np.uint64(i)]


_RMS_ROWS = SliceFunction(_rms_rows)


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
        self._plans: dict[tuple[int, ...], tuple[tuple[int, ...], int, np.ndarray]] = {}

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

    def plan(self, shape: tuple[int, ...]) -> tuple[tuple[int, ...], int, np.ndarray]:
        """``(normalized dims, row length, row slice bounds)`` for an input of ``shape``
        (once per shape: np.prod takes microseconds)."""
        cached = self._plans.get(shape)
        if cached is None:
            axis = self.info.descriptor.axis % len(shape)
            rows = int(np.prod(shape[:axis], dtype=np.int64))
            length = int(np.prod(shape[axis:], dtype=np.int64))
            cached = self._plans[shape] = (shape[axis:], length, self.bounds(rows, length))
        return cached

    def execute(self, inputs, outputs=None):
        x = np.ascontiguousarray(inputs[0])
        out = np.empty_like(x) if outputs is None else outputs[0]
        normalized, length, bounds = self.plan(x.shape)
        if x.size:
            scale = self.scale(inputs[1], normalized)
            flat, dst = x.reshape(-1), out.reshape(-1)
            _RMS_ROWS.run(bounds.shape[0] - 1, (flat, dst, bounds, length, scale, self.epsilon))
        return [out]
