"""Matrix times vector: a layer with one column of output per image, such as a classifier's
Gemm at batch 1 or a squeeze-excitation's 1x1 convs on a 1x1 plane.

There the GEMM degenerates: each weight is read once and used once, so the time is the time to
stream the weights through the core, and neither register tiles (a 16-column tile with one
column filled) nor BLAS (packing, a call per layer) are near it. Here each output is a dot
product of a contiguous weight row with the (contiguous) input vector, four rows at a time so
that each load of the input serves four sums; ``reassoc`` lets LLVM keep the sums in vector
lanes. On one AVX2 EPYC core, a whole Conv layer: 576x144 78 -> 11 us (was register tiles),
1000x1024 275 -> 72 us (was BLAS), faster than OpenBLAS's own sgemv on one thread (82 us).

A few vectors at once (a batch of 2 to 4 images, a Gemm of that many rows) go through the
weights together, four (or three) or two vectors per pass: weights too large for the caches
(AlexNet's first classifier layer, 9216x4096, 151 MB) stream from memory once per pass, not
once per vector. On one Zen 5 core, that layer: one vector 5.3-5.7 ms; two 6.4-6.7 ms (10.8
one after the other); three 7.6 ms; four 8.0 ms (21.5).
"""

from __future__ import annotations

import numpy as np
from numba import njit

from flowrt.workers.cpu.acc.calls import SliceFunction
from flowrt.workers.cpu.acc.half import widen
from flowrt.workers.cpu.acc.kernels.epilogue import activate_row

# Vectors (images, rows of a Gemm's A) up to which these products beat one GEMM of them all
# (four go through the weights in one pass; more take a pass per four).
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


@njit(nogil=True, cache=True, fastmath=_SUMS)
def _dots4x2(w, r, x, n, out, bias):
    """:func:`_dots4` for vectors ``x[n]`` and ``x[n + 1]`` into ``out[n]`` and ``out[n + 1]``
    at once: each weight is read once for both."""
    s0 = s1 = s2 = s3 = t0 = t1 = t2 = t3 = np.float32(0)
    r0, r1, r2, r3 = np.uint64(r), np.uint64(r + 1), np.uint64(r + 2), np.uint64(r + 3)
    n0, n1 = np.uint64(n), np.uint64(n + 1)
    for k in range(np.uint64(x.shape[1])):
        u, v = x[n0, k], x[n1, k]
        a, b, c, d = widen(w[r0, k]), widen(w[r1, k]), widen(w[r2, k]), widen(w[r3, k])
        s0 += a * u
        s1 += b * u
        s2 += c * u
        s3 += d * u
        t0 += a * v
        t1 += b * v
        t2 += c * v
        t3 += d * v
    b0, b1, b2, b3 = bias[r0], bias[r1], bias[r2], bias[r3]
    out[n0, r0], out[n0, r1], out[n0, r2], out[n0, r3] = s0 + b0, s1 + b1, s2 + b2, s3 + b3
    out[n1, r0], out[n1, r1], out[n1, r2], out[n1, r3] = t0 + b0, t1 + b1, t2 + b2, t3 + b3


@njit(nogil=True, cache=True, fastmath=_SUMS)
def _dots4x4(w, r, x, n, last, out, bias):
    """:func:`_dots4x2` for the vectors ``x[n]``, ``x[n + 1]``, ``x[n + 2]`` and ``x[last]``
    (``n + 3``, or ``n + 2`` again where only three are left: its sums written twice)."""
    z = np.float32(0)
    s00 = s01 = s02 = s03 = s10 = s11 = s12 = s13 = z
    s20 = s21 = s22 = s23 = s30 = s31 = s32 = s33 = z
    r0, r1, r2, r3 = np.uint64(r), np.uint64(r + 1), np.uint64(r + 2), np.uint64(r + 3)
    n0, n1, n2, n3 = np.uint64(n), np.uint64(n + 1), np.uint64(n + 2), np.uint64(last)
    for k in range(np.uint64(x.shape[1])):
        a, b, c, d = widen(w[r0, k]), widen(w[r1, k]), widen(w[r2, k]), widen(w[r3, k])
        v0, v1, v2, v3 = x[n0, k], x[n1, k], x[n2, k], x[n3, k]
        s00 += a * v0
        s01 += b * v0
        s02 += c * v0
        s03 += d * v0
        s10 += a * v1
        s11 += b * v1
        s12 += c * v1
        s13 += d * v1
        s20 += a * v2
        s21 += b * v2
        s22 += c * v2
        s23 += d * v2
        s30 += a * v3
        s31 += b * v3
        s32 += c * v3
        s33 += d * v3
    b0, b1, b2, b3 = bias[r0], bias[r1], bias[r2], bias[r3]
    out[n0, r0], out[n0, r1], out[n0, r2], out[n0, r3] = s00 + b0, s01 + b1, s02 + b2, s03 + b3
    out[n1, r0], out[n1, r1], out[n1, r2], out[n1, r3] = s10 + b0, s11 + b1, s12 + b2, s13 + b3
    out[n2, r0], out[n2, r1], out[n2, r2], out[n2, r3] = s20 + b0, s21 + b1, s22 + b2, s23 + b3
    out[n3, r0], out[n3, r1], out[n3, r2], out[n3, r3] = s30 + b0, s31 + b1, s32 + b2, s33 + b3


@njit(nogil=True, cache=True)
def gemv_rows(w, x, bias, out, r0, r1, code, alpha, beta):
    """``out[n, r] = activation(w[r] @ x[n] + bias[r])`` for rows ``r0 .. r1`` and every
    vector ``n``: ``w`` (M, K), ``x`` (N, K), ``bias`` (M,) and ``out`` (N, M), float32 (``w``
    float32 or float16 bits, ``half.py``) and C-contiguous. Vectors go four (or the last
    three) at a time over each four rows, then two, then one, so that weights too large for
    the caches stream in once per four vectors, not once per vector."""
    vectors = x.shape[0]
    r = r0
    while r + 4 <= r1:
        n = 0
        while n + 3 <= vectors:
            _dots4x4(w, r, x, n, min(n + 3, vectors - 1), out, bias)
            n += 4
        while n + 2 <= vectors:
            _dots4x2(w, r, x, n, out, bias)
            n += 2
        if n < vectors:
            _dots4(w, r, x[n], out[n], bias)
        r += 4
    while r < r1:
        for n in range(vectors):
            _dot1(w, r, x[n], out[n], bias)
        r += 1
    for n in range(vectors):
        row = out[n, r0:r1]
        activate_row(row, row, np.float32(-0.0), code, alpha, beta)


@njit(nogil=True, cache=True)
def _gemv_task(task, _step, w, x, bias, out, bounds, code, alpha, beta):
    """Task (slice of ``bounds`` over the rows) of :func:`gemv`, for every vector."""
    gemv_rows(w, x, bias, out, bounds[task], bounds[task + 1], code, alpha, beta)


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
    (N, K), ``out`` (N, M); one task per slice of ``bounds``, by address."""
    args = (w, x, bias, out, bounds, code, alpha, beta)
    _GEMV_TASK.run(bounds.shape[0] - 1, args)
