"""Single-precision GEMM for CpuAcc kernels: scipy's BLAS called from inside numba, one thread
per call, on row-major views.

CpuAcc kernels split their window across workers themselves (``prange``), so each BLAS call
must run on the calling thread alone: :func:`pin_scipy_blas` limits scipy's OpenBLAS (the one
numba links to) to one thread. numpy's own OpenBLAS is left alone; CpuRef uses it.

:func:`sgemm` calls the ``numba_xxgemm`` helper that numba's own ``np.dot`` uses. Unlike
``np.dot``, it takes strided views (a column block of a matrix, a transposed operand) and
``beta``, so a slice can write straight into its block of the output.
"""

from __future__ import annotations

import logging

import numpy as np
import scipy.linalg.cython_blas  # noqa: F401  (loads the library numba's BLAS calls)
import threadpoolctl
from numba import njit, types

logger = logging.getLogger(__name__)

_pinned = False


def pin_scipy_blas() -> None:
    """Limit scipy's OpenBLAS to one thread (once per process); numpy's keeps its threads."""
    global _pinned
    if _pinned:
        return
    for lib in threadpoolctl.ThreadpoolController().lib_controllers:
        # numpy's bundled library is libscipy_openblas64_ (in numpy.libs); scipy's is in scipy.libs.
        if "scipy" in lib.filepath and "libscipy_openblas64_" not in lib.filepath:
            lib.set_num_threads(1)
            logger.debug("pinned %s to one thread", lib.filepath)
    _pinned = True


# int numba_xxgemm(kind, transa, transb, m, n, k, *alpha, *a, lda, *b, ldb, *beta, *c, ldc):
# column-major, as Fortran BLAS. A named symbol (not a function pointer) keeps callers cacheable.
_f32p = types.CPointer(types.float32)
_xxgemm = types.ExternalFunction(
    "numba_xxgemm",
    types.intc(
        types.char, types.char, types.char, types.intp, types.intp, types.intp,
        _f32p, _f32p, types.intp, _f32p, types.intp, _f32p, _f32p, types.intp,
    ),
)  # fmt: skip
# int numba_xxgemv(kind, trans, m, n, *alpha, *a, lda, *x, *beta, *y), unit increments.
_xxgemv = types.ExternalFunction(
    "numba_xxgemv",
    types.intc(types.char, types.char, types.intp, types.intp, _f32p, _f32p, types.intp, _f32p, _f32p, _f32p),
)
_SINGLE, _NO_TRANS, _TRANS = ord("s"), ord("N"), ord("T")

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


@njit(inline="always", nogil=True, cache=True)
def leading_dimension(x):
    """The row stride (in elements) of a row-major 2-D view whose rows are contiguous."""
    rows, cols = x.shape
    ld = x.strides[0] // 4 if rows > 1 else cols
    return max(ld, cols, 1)


@njit(nogil=True, cache=True)
def sgemm(trans_a, trans_b, alpha, a, b, beta, c):
    """``c = alpha * op(a) @ op(b) + beta * c`` on float32 2-D views with unit column stride;
    ``op(x)`` is ``x.T`` when its flag is set. Runs on the calling thread (see the module doc),
    in blocks of columns when ``m * k`` is small (see ``SMALL_GEMM``)."""
    m, n = c.shape
    k = a.shape[0] if trans_a else a.shape[1]
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
        _xxgemv(
            _SINGLE,
            _TRANS if trans_b else _NO_TRANS,
            k if trans_b else n,
            n if trans_b else k,
            scalars[0:].ctypes,
            b.ctypes,
            leading_dimension(b),
            a.ctypes,
            scalars[1:].ctypes,
            c.ctypes,
        )
        return
    step = n
    columns = FEW_ROWS_COLUMNS if m <= FEW_ROWS and trans_b else SMALL_GEMM_COLUMNS
    if m * n * k > SMALL_GEMM and m * k * columns <= SMALL_GEMM:
        step = SMALL_GEMM // (m * k)
    ldb, ldc = leading_dimension(b), leading_dimension(c)
    for j0 in range(0, n, step):
        j1 = min(j0 + step, n)
        # Row-major C = op(A) op(B) is column-major C' = op(B)' op(A)': the operands swap
        # places. Columns j0:j1 of C come from those of op(B).
        _xxgemm(
            _SINGLE,
            _TRANS if trans_b else _NO_TRANS,
            _TRANS if trans_a else _NO_TRANS,
            j1 - j0,
            m,
            k,
            scalars[0:].ctypes,
            (b[j0:j1] if trans_b else b[:, j0:j1]).ctypes,
            ldb,
            a.ctypes,
            leading_dimension(a),
            scalars[1:].ctypes,
            c[:, j0:j1].ctypes,
            ldc,
        )
