"""Softmax and LogSoftmax along one axis, numerically stable (shifted by the max).

The input is seen as (outer, length, inner): the op runs along ``length``. From opset 13 that
is the op's axis; before, the input is coerced to 2-D and the op runs along all the dims from
``axis`` on (``inner`` is 1). The window is the (outer row, block of inner columns) pairs;
each computes its columns' max, sum and output with unit-stride loops over the block.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

from flowrt.engine.scheduler.window import SplitHint, split_bounds
from flowrt.registry import Support, WorkloadInfo
from flowrt.workers.cpu.acc.calls import NATIVE, SliceFunction
from flowrt.workers.cpu.acc.kernels import acc_kernel, float32_data
from flowrt.workers.cpu.acc.kernels.activation import MIN_SLICE
from flowrt.workers.cpu.acc.kernels.fastmath import exp as fast_exp
from flowrt.workers.cpu.acc.kernels.fastmath import exp_nonpositive, maxnum

# Inner columns one unit of work handles together: its running max and sum stay in L1.
BLOCK = 256
# Floats of contiguous rows transformed together (see _rows): 64 KB.
ROWS_BLOCK_FLOATS = 16 * 1024


@njit(**NATIVE)
def _row_max(x):
    """The largest value of ``x`` other than NaN (NaN if all are): a NaN of the row then
    makes its exp, the sum and so every output NaN, as numpy's max would."""
    top = x[0]
    for k in range(x.shape[0]):
        top = maxnum(top, x[np.uint64(k)])
    return top


@njit(**NATIVE)
def _shifted(x, top, out):
    """``out = x - top``."""
    for k in range(x.shape[0]):
        j = np.uint64(k)
        out[j] = x[j] - top


@njit(**NATIVE)
def _exp_in_place(values):
    """``values = exp(values)`` for values <= 0 (or NaN): one loop over many rows, so that
    the exp runs in whole vectors but for the block's last few elements (a row's own loop
    ran the last ``length % lanes`` of every row one at a time: 5 of attention's 197)."""
    for k in range(values.shape[0]):
        j = np.uint64(k)
        values[j] = exp_nonpositive(values[j])


@njit(**NATIVE, fastmath={"reassoc"})
def _row_sum(x):
    """The sum of ``x`` in float32, in as many running sums as the vector has lanes."""
    total = np.float32(0)
    for k in range(x.shape[0]):
        total += x[np.uint64(k)]
    return total


@njit(inline="always", nogil=True, cache=True)
def _rows(x, out, first, last, log, tops):
    """Rows ``first .. last`` of ``x`` (rows, length), each one distribution laid out
    contiguously, into ``out``: shifted by their max row by row, one exp over all of them,
    then summed and scaled row by row; a loop per step, so that each vectorizes (the exp is
    ``fastmath``'s; the sum may reassociate, the exp may not). One Zen 5 core, attention's
    6 x 197 rows of 197: 185 -> 106 us (ORT: 57). ``tops``: scratch for the rows' maxima."""
    length = x.shape[1]
    for o in range(first, last):
        top = tops[o - first] = _row_max(x[o])
        _shifted(x[o], top, out[o])
    _exp_in_place(out.reshape(-1)[first * length : last * length])
    for o in range(first, last):
        row, dst = x[o], out[o]
        total = _row_sum(dst)
        if log:
            shift = np.float32(math.log(total))
            top = tops[o - first]
            for k in range(length):
                j = np.uint64(k)
                dst[j] = (row[j] - top) - shift
        else:
            scale = np.float32(1) / total
            for k in range(length):
                j = np.uint64(k)
                dst[j] = dst[j] * scale


@njit(inline="always", nogil=True, cache=True)
def _columns(x, out, top, total, log):
    """``x.shape[1]`` distributions side by side, each down one column of ``x``."""
    length, width = x.shape
    # Loops, not top[:width] = x[0]: a slice assignment compiles numba's formatted error
    # messages for shapes that do not broadcast (seconds on a cold cache).
    first_row = x[0]
    for i in range(width):
        top[i] = first_row[i]
        total[i] = 0
    for k in range(1, length):
        row = x[k]
        for i in range(width):
            j = np.uint64(i)
            top[j] = np.maximum(top[j], row[j])
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


@njit(nogil=True, cache=True, no_cfunc_wrapper=True)  # type: ignore[call-overload]  # numba's stubs lack no_cfunc_wrapper
def _softmax_rows(task, step, x, out, bounds, blocks, log):
    """The rows of slice ``task`` (a :class:`SliceFunction`), ``x`` and ``out`` (outer,
    length) when ``inner`` is 1: each row is then typed contiguous, and its loops vectorize.
    ``blocks`` is 1."""
    # rows a block at a time, the block staying in L1/L2 through its three passes
    per_block = max(1, ROWS_BLOCK_FLOATS // max(1, x.shape[1]))
    tops = np.empty(per_block, np.float32)
    for first in range(bounds[task], bounds[task + 1], per_block):
        _rows(x, out, first, min(first + per_block, bounds[task + 1]), log, tops)


@njit(nogil=True, cache=True, no_cfunc_wrapper=True)  # type: ignore[call-overload]  # numba's stubs lack no_cfunc_wrapper
def _softmax_units(task, step, x, out, bounds, blocks, log):
    """The (row, column block) units of slice ``task`` (a :class:`SliceFunction`), ``x`` and
    ``out`` (outer, length, inner)."""
    inner = x.shape[2]
    top = np.empty(BLOCK, np.float32)
    total = np.empty(BLOCK, np.float64)
    for unit in range(bounds[task], bounds[task + 1]):
        o, first = unit // blocks, (unit % blocks) * BLOCK
        last = min(inner, first + BLOCK)
        _columns(x[o, :, first:last], out[o, :, first:last], top, total, log)


# Two slice functions, so that a layer compiles only its own: most softmaxes run along
# contiguous rows (a classifier's, attention's).
_SOFTMAX_ROWS = SliceFunction(_softmax_rows)
_SOFTMAX_UNITS = SliceFunction(_softmax_units)


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
        self._plans: dict[tuple[int, ...], tuple[tuple[int, ...], SliceFunction, int, np.ndarray]] = {}

    def plan(self, shape: tuple[int, ...]) -> tuple[tuple[int, ...], SliceFunction, int, np.ndarray]:
        """``(view, slice function, column blocks, bounds)`` for an input of ``shape``: the
        view is ``(outer, length)`` for :func:`_softmax_rows` when ``inner`` is 1, else
        ``(outer, length, inner)`` for :func:`_softmax_units`."""
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
            if inner == 1:
                cached = ((outer, length), _SOFTMAX_ROWS, blocks, bounds)
            else:
                cached = ((outer, length, inner), _SOFTMAX_UNITS, blocks, bounds)
            self._plans[shape] = cached
        return cached

    def execute(self, inputs, outputs=None):
        x = np.ascontiguousarray(inputs[0])
        out = np.empty_like(x) if outputs is None else outputs[0]
        view, function, blocks, bounds = self.plan(x.shape)
        if x.size:
            x, out_view = x.reshape(view), out.reshape(view)
            # one slice runs on this thread through the dispatcher straight away, unless the
            # launches are being recorded (``SliceFunction.run``)
            function.run(bounds.shape[0] - 1, (x, out_view, bounds, blocks, self.log))
        return [out]
