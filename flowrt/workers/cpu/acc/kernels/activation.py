"""Activations over a flat window: one numba parallel region runs every slice.

The window is the flattened tensor; it is split into one slice per worker (never below
``MIN_SLICE`` elements), and each slice is a tight loop compiled ``nogil``.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from flowrt.engine.graph.passes.fuse_activation import as_fused_activation
from flowrt.engine.scheduler.window import SplitHint, split_bounds
from flowrt.registry import Support, WorkloadInfo
from flowrt.workers.cpu.acc.kernels import acc_kernel, float32_data
from flowrt.workers.cpu.acc.kernels.epilogue import CODES, NO_BIAS, activate_row, activation_args

# Below this many elements per slice, a second thread costs more than it saves.
MIN_SLICE = 16384


@njit(parallel=True, nogil=True, cache=True)
def _activation(x, out, bounds, code, alpha, beta):
    for s in prange(bounds.shape[0] - 1):
        lo, hi = bounds[s], bounds[s + 1]
        activate_row(out[lo:hi], x[lo:hi], NO_BIAS, code, alpha, beta)


@acc_kernel("Relu", "LeakyRelu", "Sigmoid", "Tanh")
class ActivationKernel:
    """One activation over every element, split into slices across the CPU workers."""

    split_hint = SplitHint(axis=0, min_slice=MIN_SLICE)

    @classmethod
    def supports(cls, info: WorkloadInfo) -> Support:
        return float32_data(info)

    def __init__(self, info: WorkloadInfo, workers: int) -> None:
        self.info = info
        self.workers = workers
        self.code, self.alpha, self.beta = activation_args(
            as_fused_activation(info.kind, info.descriptor, info.constants)
        )
        assert self.code == CODES[info.kind]
        self._bounds: dict[int, np.ndarray] = {}

    def bounds(self, size: int) -> np.ndarray:
        """Slice boundaries for a flat size (computed once per size)."""
        cached = self._bounds.get(size)
        if cached is None:
            cached = self._bounds[size] = split_bounds(size, self.split_hint, self.workers)
        return cached

    def execute(self, inputs, outputs=None):
        x = np.ascontiguousarray(inputs[0])
        out = np.empty_like(x) if outputs is None else outputs[0]
        flat = x.reshape(-1)
        _activation(flat, out.reshape(-1), self.bounds(flat.size), self.code, self.alpha, self.beta)
        return [out]
