"""Matrix times vector: a layer with one column of output per image, such as a classifier's
Gemm at batch 1 or a squeeze-excitation's 1x1 convs on a 1x1 plane.

There the GEMM degenerates: each weight is read once and used once, so the time is the time to
stream the weights through the core, and neither register tiles (a 16-column tile with one
column filled) nor BLAS (packing, a call per layer) are near it. Here each output is a dot
product of a contiguous weight row with the (contiguous) input vector, four rows at a time so
that each load of the input serves four sums; ``reassoc`` lets LLVM keep the sums in vector
lanes. On one AVX2 EPYC core, a whole Conv layer: 576x144 78 -> 11 us (was register tiles),
1000x1024 275 -> 72 us (was BLAS), faster than OpenBLAS's own sgemv on one thread (82 us).
"""

from __future__ import annotations

import numpy as np
from numba import njit

from flowrt.workers.cpu.acc.calls import SliceFunction
from flowrt.workers.cpu.acc.half import widen
from flowrt.workers.cpu.acc.kernels.epilogue import activate_row

# Vectors (images, rows of a Gemm's A) up to which one product per vector beats one GEMM of
# them all (each reads the weights again, from L2 or L3).
MAX_VECTORS = 4
# Weights per task below which a split costs more than it saves (a row of 1024 weights
# streams in ~0.1 us; a region starts on CpuAcc's team in about 1 us).
MIN_TASK_WEIGHTS = 16 * 1024


# reassoc: the sums may be kept in vector lanes; contract: each multiply-add one FMA.
_SUMS = {"reassoc", "contract"}


@njit(nogil=True, cache=True, fastmath=_SUMS)
def _dots4(w, r, x, out, bias):
    """``out[r .. r + 4] = w[r .. r + 4] @ x + bias[r .. r + 4]``. The rows are read by index
    of the whole matrix: a slice per row would cost two reference count updates."""
    s0 = s1 = s2 = s3 = np.float32(0)
    r0, r1, r2, r3 = np.uint64(r), np.uint64(r + 1), np.uint64(r + 2), np.uint64(r + 3)
    for k in range(np.uint64(x.shape[0])):
        v = x[k]
        s0 += widen(w[r0, k]) * v
        s1 += widen(w[r1, k]) * v
        s2 += widen(w[r2, k]) * v
        s3 += widen(w[r3, k]) * v
    out[r0] = s0 + bias[r0]
    out[r1] = s1 + bias[r1]
    out[r2] = s2 + bias[r2]
    out[r3] = s3 + bias[r3]


@njit(nogil=True, cache=True, fastmath=_SUMS)
def _dot1(w, r, x, out, bias):
    """``out[r] = w[r] @ x + bias[r]``."""
    s = np.float32(0)
    r = np.uint64(r)
    for k in range(np.uint64(x.shape[0])):
        s += widen(w[r, k]) * x[k]
    out[r] = s + bias[r]


@njit(nogil=True, cache=True)
def gemv_rows(w, x, bias, out, r0, r1, code, alpha, beta):
    """``out[r] = activation(w[r] @ x + bias[r])`` for rows ``r0 .. r1``: ``w`` (M, K), ``x``
    (K,), ``bias`` and ``out`` (M,), float32 (``w`` float32 or float16 bits, ``half.py``) and
    C-contiguous."""
    r = r0
    while r + 4 <= r1:
        _dots4(w, r, x, out, bias)
        r += 4
    while r < r1:
        _dot1(w, r, x, out, bias)
        r += 1
    row = out[r0:r1]
    activate_row(row, row, np.float32(-0.0), code, alpha, beta)


@njit(nogil=True, cache=True)
def _gemv_task(task, _step, w, x, bias, out, bounds, code, alpha, beta):
    """Task (image, slice of ``bounds`` over the rows) of :func:`gemv`."""
    n, s = divmod(task, bounds.shape[0] - 1)
    gemv_rows(w, x[n], bias, out[n], bounds[s], bounds[s + 1], code, alpha, beta)


_GEMV_TASK = SliceFunction(_gemv_task)


def row_bounds(rows: int, depth: int, workers: int) -> np.ndarray:
    """``rows`` cut into at most ``workers`` slices of at least :data:`MIN_TASK_WEIGHTS`
    weights each, on multiples of four rows."""
    slices = max(1, min(workers, rows * depth // MIN_TASK_WEIGHTS))
    quads = -(-rows // 4)
    cuts = [min(rows, quads * i // slices * 4) for i in range(slices + 1)]
    return np.array(sorted(set(cuts)), np.int64)  # np.unique imports numpy.ma (~10 ms) at load


def gemv(w, x, bias, out, bounds, code, alpha, beta):
    """``out[n] = activation(w @ x[n] + bias)`` for each image ``n``: ``w`` (M, K), ``x``
    (N, K), ``out`` (N, M); one task per (image, slice of ``bounds``), by address."""
    args = (w, x, bias, out, bounds, code, alpha, beta)
    _GEMV_TASK.run(x.shape[0] * (bounds.shape[0] - 1), args)
