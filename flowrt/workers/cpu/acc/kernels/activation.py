"""Activations over a flat window: one numba parallel region runs every slice.

The window is the flattened tensor; it is split into one slice per worker (never below
``MIN_SLICE`` elements), and each slice is a tight loop compiled ``nogil``.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit, prange

from flowrt.engine.scheduler.window import SplitHint, Window, split
from flowrt.registry import Support, WorkloadInfo
from flowrt.types import DataType
from flowrt.workers.cpu.acc.kernels import acc_kernel

# Below this many elements per slice, a second thread costs more than it saves.
MIN_SLICE = 16384


@njit(parallel=True, nogil=True, cache=True)
def _relu(x, out, bounds, alpha, beta):
    for s in prange(bounds.shape[0] - 1):
        for i in range(bounds[s], bounds[s + 1]):
            v = x[i]
            out[i] = v if v > 0 else 0


@njit(parallel=True, nogil=True, cache=True)
def _leaky_relu(x, out, bounds, alpha, beta):
    for s in prange(bounds.shape[0] - 1):
        for i in range(bounds[s], bounds[s + 1]):
            v = x[i]
            out[i] = v if v >= 0 else v * alpha


@njit(parallel=True, nogil=True, cache=True)
def _sigmoid(x, out, bounds, alpha, beta):
    for s in prange(bounds.shape[0] - 1):
        for i in range(bounds[s], bounds[s + 1]):
            v = x[i]
            # two branches keep exp() from overflowing for large |v|
            if v >= 0:
                out[i] = 1 / (1 + math.exp(-v))
            else:
                e = math.exp(v)
                out[i] = e / (1 + e)


@njit(parallel=True, nogil=True, cache=True)
def _tanh(x, out, bounds, alpha, beta):
    for s in prange(bounds.shape[0] - 1):
        for i in range(bounds[s], bounds[s + 1]):
            out[i] = math.tanh(x[i])


def _parameters(info: WorkloadInfo) -> tuple[float, float]:
    """The (alpha, beta) scalars of the layer: LeakyRelu's slope."""
    if info.kind == "LeakyRelu":
        return float(info.descriptor.alpha), 0.0
    return 0.0, 0.0


_FUNCTIONS = {"Relu": _relu, "LeakyRelu": _leaky_relu, "Sigmoid": _sigmoid, "Tanh": _tanh}


@acc_kernel(*_FUNCTIONS)
class ActivationKernel:
    """One activation over every element, split into slices across the CPU workers."""

    split_hint = SplitHint(axis=0, min_slice=MIN_SLICE)

    @classmethod
    def supports(cls, info: WorkloadInfo) -> Support:
        x = info.inputs[0]
        if x is None or x.dtype is not DataType.FLOAT32:
            return Support.no("CpuAcc activations take float32 only")
        return Support.yes()

    def __init__(self, info: WorkloadInfo, workers: int) -> None:
        self.info = info
        self.workers = workers
        self.function = _FUNCTIONS[info.kind]
        alpha, beta = _parameters(info)
        self.alpha, self.beta = np.float32(alpha), np.float32(beta)
        self._bounds: dict[int, np.ndarray] = {}

    def window(self, size: int) -> Window:
        return Window.of_shape((size,))

    def bounds(self, size: int) -> np.ndarray:
        """Slice boundaries for a flat size (computed once per size)."""
        cached = self._bounds.get(size)
        if cached is None:
            slices = split(self.window(size), self.split_hint, self.workers)
            cached = np.array([s.dims[0].start for s in slices] + [size], dtype=np.int64)
            self._bounds[size] = cached
        return cached

    def execute(self, inputs):
        x = np.ascontiguousarray(inputs[0])
        out = np.empty_like(x)
        flat = x.reshape(-1)
        self.function(flat, out.reshape(-1), self.bounds(flat.size), self.alpha, self.beta)
        return [out]
