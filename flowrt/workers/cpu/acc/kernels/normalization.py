"""Normalization kernels: BatchNormalization (inference), LRN and LayerNormalization.

BatchNormalization folds its four per-channel parameters into one scale and shift at load
and splits the flat tensor into equal slices, each walking its part plane by plane. LRN
splits the (sample, block of spatial positions) columns: each computes every channel of its
block, the squares summed over unit-stride rows. LayerNormalization splits its rows.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

from flowrt.engine.scheduler.window import SplitHint, split_bounds
from flowrt.registry import Support, WorkloadInfo
from flowrt.types import DataType
from flowrt.workers.cpu.acc.calls import NATIVE, SliceFunction
from flowrt.workers.cpu.acc.kernels import acc_kernel, float32_data
from flowrt.workers.cpu.acc.kernels.activation import MIN_SLICE
from flowrt.workers.cpu.acc.kernels.epilogue import activation_args, affine_row
from flowrt.workers.cpu.acc.kernels.row_sums import row_sum, row_sum_of_squares

# Spatial positions LRN keeps in one block: its running sums stay in L1.
LRN_BLOCK = 512
# The LRN exponent of AlexNet, GoogLeNet and their kin, computed with square roots.
THREE_QUARTERS = np.float32(0.75)


class _Bounds:
    """Slice boundaries per window size, computed once per size."""

    def __init__(self, workers: int) -> None:
        self.workers = workers
        self._bounds: dict[tuple[int, int], np.ndarray] = {}

    def __call__(self, size: int, min_slice: int) -> np.ndarray:
        key = (size, min_slice)
        cached = self._bounds.get(key)
        if cached is None:
            cached = self._bounds[key] = split_bounds(size, SplitHint(0, max(1, min_slice)), self.workers)
        return cached


# Indices are cast to uint64 in the hot loops: numba wraps negative signed indices around,
# and that check keeps LLVM from vectorizing.


@njit(**NATIVE)
def _batch_normalization_slice(task, step, x, out, bounds, scale, shift, channels, plane, code, alpha, beta):
    """Slice ``task`` of the flat window (a :class:`SliceFunction`), plane by plane."""
    i, last = bounds[task], bounds[task + 1]
    while i < last:
        p = i // plane
        end = min(last, (p + 1) * plane)
        c = p % channels
        affine_row(out[i:end], x[i:end], scale[c], shift[c], code, alpha, beta)
        i = end


_BATCH_NORMALIZATION = SliceFunction(_batch_normalization_slice)


def folded(scale, bias, mean, var, epsilon: float) -> tuple[np.ndarray, np.ndarray]:
    """BatchNormalization's parameters as one float32 (scale, shift) pair per channel,
    computed as CpuRef computes them."""
    s, b, m, v = (
        np.asarray(p).astype(np.promote_types(p.dtype, np.float32), copy=False).reshape(-1)
        for p in (scale, bias, mean, var)
    )
    factor = s / np.sqrt(v + v.dtype.type(epsilon))
    return (np.ascontiguousarray(factor, np.float32), np.ascontiguousarray(b - m * factor, np.float32))


@acc_kernel("BatchNormalization")
class BatchNormalizationKernel:
    """Inference BatchNormalization as one multiply-add per element, with the fused activation.

    The per-channel scale and shift are folded at load when the parameters are constants
    (the usual case), else at each run.
    """

    split_hint = SplitHint(axis=0, min_slice=MIN_SLICE)

    @classmethod
    def supports(cls, info: WorkloadInfo) -> Support:
        desc = info.descriptor
        if desc.training:
            return Support.no("CpuAcc BatchNormalization runs inference only, not training mode")
        if desc.num_outputs != 1:
            return Support.no("CpuAcc BatchNormalization computes Y only, not the running statistics")
        if not desc.spatial:
            return Support.no("CpuAcc BatchNormalization takes per-channel parameters only (spatial=1)")
        return float32_data(info)

    def __init__(self, info: WorkloadInfo, workers: int) -> None:
        self.info = info
        self.bounds = _Bounds(workers)
        self.code, self.alpha, self.beta = activation_args(info.activation)
        params = tuple(info.constants[1:5])
        self.params = (
            folded(*params, info.descriptor.epsilon)
            if len(params) == 4 and all(p is not None for p in params)
            else None
        )

    def execute(self, inputs, outputs=None):
        x = np.ascontiguousarray(inputs[0])
        out = np.empty_like(x) if outputs is None else outputs[0]
        scale, shift = self.params or folded(*inputs[1:5], self.info.descriptor.epsilon)
        channels = x.shape[1]
        plane = x.size // max(1, x.shape[0] * channels)
        if x.size:
            bounds = self.bounds(x.size, MIN_SLICE)
            args = (x.reshape(-1), out.reshape(-1), bounds, scale, shift, channels, plane)
            _BATCH_NORMALIZATION.run(bounds.shape[0] - 1, args + (self.code, self.alpha, self.beta))
        return [out]


@njit(**NATIVE)
def _lrn_units(task, step, x, out, bounds, blocks, before, after, bias, alpha, beta):
    """The (sample, block) units of slice ``task`` (a :class:`SliceFunction`)."""
    channels, positions = x.shape[1], x.shape[2]
    square_sum = np.empty(LRN_BLOCK, np.float32)
    for unit in range(bounds[task], bounds[task + 1]):
        n, first = unit // blocks, (unit % blocks) * LRN_BLOCK
        width = min(LRN_BLOCK, positions - first)
        for c in range(channels):
            square_sum[:width] = 0
            # Channels c - before .. c + after, in CpuRef's order (the pad's zeros add nothing).
            for j in range(max(0, c - before), min(channels, c + after + 1)):
                row = x[n, j, first:]
                for i in range(width):
                    k = np.uint64(i)
                    square_sum[k] += row[k] * row[k]
            src, dst = x[n, c, first:], out[n, c, first:]
            if beta == THREE_QUARTERS:
                # s ** 0.75 as sqrt(s) * sqrt(sqrt(s)): sqrt vectorizes, pow does not.
                # Within 4 ulps of CpuRef's powf.
                for i in range(width):
                    k = np.uint64(i)
                    root = math.sqrt(bias + alpha * square_sum[k])
                    dst[k] = src[k] / (root * math.sqrt(root))
            else:
                for i in range(width):
                    k = np.uint64(i)
                    dst[k] = src[k] / (bias + alpha * square_sum[k]) ** beta


_LRN_UNITS = SliceFunction(_lrn_units)


@acc_kernel("LRN")
class LRNKernel:
    """Local response normalization across channels, blocks of spatial positions split
    across workers."""

    split_hint = SplitHint(axis=0, min_slice=1)

    @classmethod
    def supports(cls, info: WorkloadInfo) -> Support:
        return float32_data(info)

    def __init__(self, info: WorkloadInfo, workers: int) -> None:
        desc = info.descriptor
        self.info = info
        self.bounds = _Bounds(workers)
        self.before, self.after = (desc.size - 1) // 2, desc.size // 2
        # The constants in float32, as CpuRef takes them.
        self.bias, self.alpha, self.beta = (
            np.float32(desc.bias),
            np.float32(desc.alpha / desc.size),
            np.float32(desc.beta),
        )

    def execute(self, inputs, outputs=None):
        x = np.ascontiguousarray(inputs[0])
        out = np.empty_like(x) if outputs is None else outputs[0]
        n, c = x.shape[:2]
        columns = x.reshape(n, c, -1)
        blocks = -(-columns.shape[2] // LRN_BLOCK)
        if x.size:
            work = c * (self.before + self.after + 2) * min(LRN_BLOCK, columns.shape[2])
            bounds = self.bounds(n * blocks, -(-MIN_SLICE // work))
            args = (columns, out.reshape(columns.shape), bounds, blocks, self.before, self.after)
            _LRN_UNITS.run(bounds.shape[0] - 1, args + (self.bias, self.alpha, self.beta))
        return [out]


@njit(**NATIVE)
def _layer_normalization_rows(task, step, x, out, mean, inv_std, bounds, scale, bias, epsilon):
    """The rows of slice ``task`` (a :class:`SliceFunction`)."""
    length = x.shape[1]
    for r in range(bounds[task], bounds[task + 1]):
        row, dst = x[r], out[r]
        # Sums in float64; the statistics themselves in float32, as CpuRef keeps them.
        m = np.float32(row_sum(row) / length)
        inv = np.float32(1) / np.sqrt(np.float32(row_sum_of_squares(row, m) / length) + epsilon)
        mean[r], inv_std[r] = m, inv
        for i in range(length):
            k = np.uint64(i)
            dst[k] = (row[k] - m) * inv * scale[k] + bias[k]


_LAYER_NORMALIZATION_ROWS = SliceFunction(_layer_normalization_rows)


@acc_kernel("LayerNormalization")
class LayerNormalizationKernel:
    """LayerNormalization over the dims from ``axis`` on, rows split across workers; also
    the optional Mean and InvStdDev outputs."""

    split_hint = SplitHint(axis=0, min_slice=1)

    @classmethod
    def supports(cls, info: WorkloadInfo) -> Support:
        scale = info.inputs[1] if len(info.inputs) > 1 else None
        if scale is not None and scale.dtype is not DataType.FLOAT32:
            return Support.no("CpuAcc LayerNormalization takes float32 only")
        return float32_data(info)

    def __init__(self, info: WorkloadInfo, workers: int) -> None:
        self.info = info
        self.bounds = _Bounds(workers)
        self.epsilon = np.float32(info.descriptor.epsilon)
        constants = tuple(info.constants) + (None,) * (3 - len(info.constants))
        has_bias = len(info.inputs) > 2 and info.inputs[2] is not None
        self.constant = constants[1] is not None and (constants[2] is not None or not has_bias)
        self._params: dict[tuple[int, ...], tuple[np.ndarray, np.ndarray]] = {}
        self._plans: dict[tuple[int, ...], tuple[int, int, int]] = {}

    def params(self, inputs, normalized: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
        """Scale and bias broadcast to the normalized dims, flat float32 (kept when constant)."""
        cached = self._params.get(normalized)
        if cached is None:
            bias = inputs[2] if len(inputs) > 2 and inputs[2] is not None else np.zeros((), np.float32)
            scale, shift = (
                np.ascontiguousarray(np.broadcast_to(p, normalized), np.float32).reshape(-1)
                for p in (inputs[1], bias)
            )
            cached = (scale, shift)
            if self.constant:
                self._params[normalized] = cached
        return cached

    def plan(self, shape: tuple[int, ...]) -> tuple[int, int, int]:
        """``(axis, rows, row length)`` for an input of ``shape`` (once per shape: np.prod
        takes microseconds)."""
        cached = self._plans.get(shape)
        if cached is None:
            axis = self.info.descriptor.axis % len(shape)
            rows = int(np.prod(shape[:axis], dtype=np.int64))
            cached = self._plans[shape] = (axis, rows, int(np.prod(shape[axis:], dtype=np.int64)))
        return cached

    def execute(self, inputs, outputs=None):
        x = np.ascontiguousarray(inputs[0])
        desc = self.info.descriptor
        axis, rows, length = self.plan(x.shape)
        if outputs is None:
            stat_shape = x.shape[:axis] + (1,) * (x.ndim - axis)
            outputs = [np.empty_like(x)] + [
                np.empty(stat_shape, np.float32) for _ in range(desc.num_outputs - 1)
            ]
        # The statistics are computed whether or not they are outputs.
        mean, inv_std = (
            outputs[i].reshape(-1) if desc.num_outputs > i else np.empty(rows, np.float32) for i in (1, 2)
        )
        if x.size:
            scale, bias = self.params(inputs, x.shape[axis:])
            bounds = self.bounds(rows, MIN_SLICE // max(1, length))
            y = outputs[0].reshape(rows, length)
            args = (x.reshape(rows, length), y, mean, inv_std, bounds, scale, bias, self.epsilon)
            _LAYER_NORMALIZATION_ROWS.run(bounds.shape[0] - 1, args)
        return list(outputs)
