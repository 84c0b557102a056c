"""Single-precision GEMM for CpuAcc kernels: BLAS called from inside numba, one thread per
call, on row-major views.

CpuAcc kernels split their window across workers themselves (``prange``), so each BLAS call
must run on the calling thread alone. They call numpy's OpenBLAS where it has the functions
``openblas.py`` needs, which the CPU workers hold at one thread while jobs that run these kernels run
(``flowrt.workers.cpu.blas_threads``); otherwise scipy's, through numba's helpers, which
:func:`pin_scipy_blas` limits to one thread (process-wide, so when the kernels that call BLAS
are imported, never when flowrt is), and scipy is imported only then.

:func:`sgemm` calls single-threaded BLAS (``openblas.py``: numpy's OpenBLAS, else scipy's). Unlike
``np.dot``, it takes strided views (a column block of a matrix, a transposed operand) and
``beta``, so a slice can write straight into its block of the output.

A kernel's parallel loop calls its slice function by address (``calls.py``: :class:`SliceFunction`,
:func:`run_tasks`, :func:`run_stages`, re-exported here). ``PRANGE_ONLY`` keeps numba from
making parallel loops of anything but ``prange``, and :func:`read_only` gives weights one array
type whatever their source.
"""

from __future__ import annotations

import importlib
import logging

import numpy as np
import threadpoolctl
from numba import njit

from flowrt.workers.cpu.acc.calls import (  # noqa: F401  (re-exported: the kernels' launchers)
    NATIVE,
    PRANGE_ONLY,
    SliceFunction,
    call_native,
    native_address,
    run_stages,
    run_tasks,
)
from flowrt.workers.cpu.acc.openblas import NUMPY_OPENBLAS, gemm, gemv, openblas_architecture

if not NUMPY_OPENBLAS:
    # numba's BLAS helpers call scipy's library: loaded now, not from a kernel's thread.
    # Where numpy's serves every call, scipy is not imported at all (0.3 s of a process's
    # start).
    importlib.import_module("scipy.linalg.cython_blas")

logger = logging.getLogger(__name__)

_pinned = False


def read_only(a: np.ndarray) -> np.ndarray:
    """``a``, or a read-only view of it. Conv takes its weights and bias, Gemm and MatMul
    their operands, read-only whatever their source (constants are read-only; a bias of
    zeros, transformed weights or a tensor of the run are not): numba compiles a kernel once
    per distinct argument type, read-only being part of the type, and a conv kernel costs
    seconds to compile on a cold cache."""
    if not a.flags.writeable:
        return a
    view = a.view()
    view.flags.writeable = False
    return view


def pin_scipy_blas() -> None:
    """Limit scipy's OpenBLAS to one thread (once per process), where CpuAcc calls it (numpy
    has no OpenBLAS of its own to call); numpy's keeps its threads."""
    global _pinned
    if _pinned or NUMPY_OPENBLAS:
        return
    for lib in threadpoolctl.ThreadpoolController().lib_controllers:
        # numpy's bundled library is libscipy_openblas64_ (in numpy.libs); scipy's is in scipy.libs.
        if "scipy" in lib.filepath and "libscipy_openblas64_" not in lib.filepath:
            lib.set_num_threads(1)
            logger.debug("pinned %s to one thread", lib.filepath)
    _pinned = True


_NO_TRANS, _TRANS = ord("N"), ord("T")

# OpenBLAS computes a GEMM whose m * n * k is at most SMALL_GEMM by kernels that skip packing
# the operands (its "small matrix" path, in its builds for AVX-512 machines): on the shapes of
# conv layers, 1.2-2x faster than its packed path (m=16, k=64: 115 against 55 GFLOP/s on one
# Zen 4 core). So :func:`sgemm` runs a GEMM of small m * k in blocks of columns that take
# that path, as long as a block keeps SMALL_GEMM_COLUMNS columns; with few columns per block
# the packed path would be slower (where a build lacks the small path, blocks of 16 or more
# columns cost the packed path little).
SMALL_GEMM = 1_000_000
SMALL_GEMM_COLUMNS = 16
# A GEMM of at most FEW_ROWS rows whose op(b) is b transposed (a fully connected layer at a
# small batch, its weights (n, k) row-major) takes the small path down to FEW_ROWS_COLUMNS
# columns per block: the packed path would first copy all the weights, tens of megabytes for
# the light models' first FC layers. m=4, k=18432, n=4096 (zfnet512's FC at batch 4): 17 ms
# in blocks of 13 columns, against 67 ms packed. A transposed b's block of columns is a block
# of its rows, contiguous; an untransposed one's is strided, and there narrow blocks run 2-3x
# slower than packed.
FEW_ROWS = 16
FEW_ROWS_COLUMNS = 4
# Whether the OpenBLAS called has that small path: its kernels for AVX-512 machines. Without
# it, blocks of columns only pay the packing again: (16, 2048) @ (2048, 2048) on one thread
# of a Haswell-kernel build took 4.2-4.5 ms in blocks of 30 columns.
SMALL_PATH = openblas_architecture() in ("SkylakeX", "Cooperlake", "SapphireRapids")


@njit(inline="always", nogil=True, cache=True)
def leading_dimension(x):
    """The row stride (in elements) of a row-major 2-D view whose rows are contiguous."""
    rows, cols = x.shape
    ld = x.strides[0] // 4 if rows > 1 else cols
    return max(ld, cols, 1)


@njit(nogil=True, cache=True, no_cfunc_wrapper=True)  # type: ignore[call-overload]  # numba's stubs lack no_cfunc_wrapper
def sgemm(trans_a, trans_b, alpha, a, b, beta, c):
    """``c = alpha * op(a) @ op(b) + beta * c`` on float32 2-D views with unit column stride;
    ``op(x)`` is ``x.T`` when its flag is set. Runs on the calling thread (see the module doc),
    in blocks of columns when ``m * k`` is small (see ``SMALL_GEMM``): :func:`gemm_at` on the
    views' addresses."""
    m, n = c.shape
    k = a.shape[0] if trans_a else a.shape[1]
    # The operands go to BLAS as addresses (see openblas.gemm).
    flags = np.int64(1 if trans_a else 0), np.int64(1 if trans_b else 0)  # not literals: one gemm_at
    gemm_at(
        flags[0], flags[1], m, n, k, np.float32(alpha),
        np.int64(a.ctypes.data), leading_dimension(a), np.int64(b.ctypes.data), leading_dimension(b),
        np.float32(beta), np.int64(c.ctypes.data), leading_dimension(c),
    )  # fmt: skip


@njit(**NATIVE)
def gemm_at(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc):
    """:func:`sgemm` on row-major float32 matrices given by address and row stride (in
    elements, at least the row's length): ``c`` (m, n), ``op(a)`` (m, k), ``op(b)`` (k, n),
    ``a`` or ``b`` transposed when ``trans_a`` or ``trans_b`` is 1. For kernels that hold
    flat buffers: a 2-D view costs numba more to compile than this call."""
    if m == 0 or n == 0:
        return
    scalars = np.empty(2, np.float32)
    scalars[0] = alpha
    scalars[1] = beta
    if m == 1:
        # One output row (a fully connected layer at batch 1): GEMV reads op(b) once, where
        # GEMM would first copy all of it into packed panels. op(a)'s one row is contiguous
        # (a row of a, or a column of a one-column a); c's row is contiguous.
        # Row-major op(b) (k, n) is the column-major matrix (n, k) when not transposed.
        gemv(
            _TRANS if trans_b else _NO_TRANS, k if trans_b else n, n if trans_b else k, scalars, b, ldb, a, c
        )
        return
    step = n
    columns = FEW_ROWS_COLUMNS if m <= FEW_ROWS and trans_b else SMALL_GEMM_COLUMNS
    if SMALL_PATH and m * n * k > SMALL_GEMM and m * k * columns <= SMALL_GEMM:
        step = SMALL_GEMM // (m * k)
    for j0 in range(0, n, step):
        j1 = min(j0 + step, n)
        # Row-major C = op(A) op(B) is column-major C' = op(B)' op(A)': the operands swap
        # places. Columns j0:j1 of C come from those of op(B): rows j0:j1 of a transposed b.
        gemm(
            _TRANS if trans_b else _NO_TRANS,
            _TRANS if trans_a else _NO_TRANS,
            j1 - j0,
            m,
            k,
            scalars,
            b + j0 * 4 * (ldb if trans_b else 1),
            ldb,
            a,
            lda,
            c + j0 * 4,
            ldc,
        )
