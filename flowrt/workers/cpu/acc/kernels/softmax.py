"""Softmax and LogSoftmax along one axis, numerically stable (shifted by the max).

The input is seen as (outer, length, inner): the op runs along ``length``. From opset 13 that
is the op's axis; before, the input is coerced to 2-D and the op runs along all the dims from
``axis`` on (``inner`` is 1). The window is the (outer row, block of inner columns) pairs;
each computes its columns' max, sum and output with unit-stride loops over the block.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit, prange

from flowrt.engine.scheduler.window import SplitHint, split_bounds
from flowrt.registry import Support, WorkloadInfo
from flowrt.workers.cpu.acc.kernels import acc_kernel, float32_data
from flowrt.workers.cpu.acc.kernels.fastmath import exp as fast_exp

# Below this many elements per slice, a second thread costs more than it saves.
MIN_SLICE = 16384
# Inner columns one unit of work handles together: its running max and sum stay in L1.
BLOCK = 256


@njit(nogil=True, cache=True, fastmath={"reassoc", "nsz"})
def _row_max(x):
    """The largest value of ``x``, NaN if it holds one (as np.max)."""
    top = x[0]
    nan = False
    for k in range(x.shape[0]):
        v = x[np.uint64(k)]
        top = v if v > top else top
        nan |= v != v
    return np.float32(np.nan) if nan else top


@njit(nogil=True, cache=True, fastmath={"reassoc"})
def _row_sum(x):
    """The sum of ``x`` in float32, in as many running sums as the vector has lanes."""
    total = np.float32(0)
    for k in range(x.shape[0]):
        total += x[np.uint64(k)]
    return total


@njit(inline="always", nogil=True, cache=True)
def _row(x, out, log):
    """One distribution laid out contiguously (``inner`` is 1): a loop per step, so that
    each vectorizes (exp is ``fastmath``'s; the sum may reassociate, the exp may not)."""
    top = _row_max(x)
    for k in range(x.shape[0]):
        j = np.uint64(k)
        out[j] = fast_exp(x[j] - top)
    total = _row_sum(out)
    if log:
        shift = np.float32(math.log(total))
        for k in range(x.shape[0]):
            j = np.uint64(k)
            out[j] = (x[j] - top) - shift
    else:
        scale = np.float32(1) / total
        for k in range(x.shape[0]):
            j = np.uint64(k)
            out[j] = out[j] * scale


@njit(inline="always", nogil=True, cache=True)
def _columns(x, out, top, total, log):
    """``x.shape[1]`` distributions side by side, each down one column of ``x``."""
    length, width = x.shape
    top[:width] = x[0]
    for k in range(1, length):
        row = x[k]
        for i in range(width):
            j = np.uint64(i)
            top[j] = np.maximum(top[j], row[j])
    total[:width] = 0
    for k in range(length):
        row, dst = x[k], out[k]
        for i in range(width):
            j = np.uint64(i)
            e = fast_exp(row[j] - top[j])
            total[j] += e
            dst[j] = e
    for i in range(width):
        total[i] = math.log(np.float32(total[i])) if log else np.float32(total[i])
    for k in range(length):
        row, dst = x[k], out[k]
        for i in range(width):
            j = np.uint64(i)
            if log:
                dst[j] = (row[j] - top[j]) - np.float32(total[j])
            else:
                dst[j] = dst[j] / np.float32(total[j])


@njit(nogil=True, cache=True)
def _softmax_units(x, out, blocks, log, first_unit, last_unit):
    """Units ``first_unit`` to ``last_unit`` (one slice of the window)."""
    inner = x.shape[2]
    if inner == 1:  # as 2-D: each row is then typed contiguous, and its loops vectorize
        rows, out_rows = x.reshape(x.shape[:2]), out.reshape(out.shape[:2])
        for o in range(first_unit, last_unit):
            _row(rows[o], out_rows[o], log)
        return
    top = np.empty(BLOCK, np.float32)
    total = np.empty(BLOCK, np.float64)
    for unit in range(first_unit, last_unit):
        o, first = unit // blocks, (unit % blocks) * BLOCK
        last = min(inner, first + BLOCK)
        _columns(x[o, :, first:last], out[o, :, first:last], top, total, log)


@njit(parallel=True, nogil=True, cache=True)
def _softmax(x, out, bounds, blocks, log):
    if bounds.shape[0] == 2:  # one slice: no parallel region
        _softmax_units(x, out, blocks, log, bounds[0], bounds[1])
        return
    for s in prange(bounds.shape[0] - 1):
        _softmax_units(x, out, blocks, log, bounds[s], bounds[s + 1])


@acc_kernel("Softmax", "LogSoftmax")
class SoftmaxKernel:
    """Softmax or LogSoftmax along one axis, (row, column block) units split across workers."""

    split_hint = SplitHint(axis=0, min_slice=1)

    @classmethod
    def supports(cls, info: WorkloadInfo) -> Support:
        return float32_data(info)

    def __init__(self, info: WorkloadInfo, workers: int) -> None:
        self.info = info
        self.workers = workers
        self.log = info.kind == "LogSoftmax"
        self._plans: dict[tuple[int, ...], tuple[tuple[int, int, int], int, np.ndarray]] = {}

    def plan(self, shape: tuple[int, ...]) -> tuple[tuple[int, int, int], int, np.ndarray]:
        """``((outer, length, inner), column blocks, bounds)`` for an input of ``shape``."""
        cached = self._plans.get(shape)
        if cached is None:
            desc = self.info.descriptor
            axis = desc.resolved_axis(len(shape), self.info.kind)
            outer = int(np.prod(shape[:axis], dtype=np.int64))
            if desc.coerces_to_2d:
                length, inner = int(np.prod(shape[axis:], dtype=np.int64)), 1
            else:
                length, inner = shape[axis], int(np.prod(shape[axis + 1 :], dtype=np.int64))
            blocks = -(-inner // BLOCK)
            work = 3 * length * min(inner, BLOCK)
            bounds = split_bounds(
                outer * blocks, SplitHint(0, max(1, -(-MIN_SLICE // max(1, work)))), self.workers
            )
            cached = self._plans[shape] = ((outer, length, inner), blocks, bounds)
        return cached

    def execute(self, inputs, outputs=None):
        x = np.ascontiguousarray(inputs[0])
        out = np.empty_like(x) if outputs is None else outputs[0]
        view, blocks, bounds = self.plan(x.shape)
        if x.size:
            _softmax(x.reshape(view), out.reshape(view), bounds, blocks, self.log)
        return [out]
