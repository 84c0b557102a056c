"""The BLAS behind CpuAcc's GEMMs: numpy's own OpenBLAS where it has one, one thread per call.

numba's ``numba_xxgemm`` helper calls scipy's OpenBLAS. numpy bundles a newer one (64-bit
integers, ``scipy_sgemm_64_``), and on this project's 2-core AMD machine it is much faster on
the shapes of fully connected layers at small batch: (16, 2048) @ (2048, 2048) takes 2.7 ms
on one thread against 4.6-5.0 ms through scipy's (OpenBLAS 0.3.31 against 0.3.30, both on
their Haswell kernels). :func:`gemm` and :func:`gemv` call numpy's where it exports those
symbols. OpenBLAS's thread count is the process's alone: the CPU workers hold it at one while
jobs that run these kernels run (``flowrt.workers.cpu.blas_threads``), so that each call runs on its calling
thread, and give numpy back its own count between runs. Where numpy has no such OpenBLAS
they call scipy's, through numba's helpers, which
:func:`flowrt.workers.cpu.acc.blas.pin_scipy_blas` limits to one thread.

The functions are reached by named symbols (``llvmlite.binding.add_symbol``), so that the
kernels calling them stay cacheable; the choice is made at import and frozen into the
compiled kernels.
"""

from __future__ import annotations

import ctypes
import logging

import llvmlite.binding
import numpy as np
import threadpoolctl
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic

from flowrt.workers.cpu.acc import cache_stamp

logger = logging.getLogger(__name__)

cache_stamp.register()  # before this module jits anything

_SYMBOLS = {
    "flowrt_sgemm64": "scipy_sgemm_64_",
    "flowrt_sgemv64": "scipy_sgemv_64_",
}


def _called_library() -> dict:
    """threadpoolctl's record of the OpenBLAS that :func:`gemm` calls (empty if none is found)."""
    infos = [i for i in threadpoolctl.threadpool_info() if i.get("internal_api") == "openblas"]
    for info in infos:
        if ("openblas64_" in info.get("filepath", "")) == NUMPY_OPENBLAS:
            return info
    return {}


def openblas_architecture() -> str:
    """The kernel set (``Haswell``, ``SkylakeX``...) of the OpenBLAS :func:`gemm` calls."""
    return str(_called_library().get("architecture", ""))


def _bind_numpy_openblas() -> bool:
    """Register numpy's OpenBLAS functions under flowrt's symbol names; False where numpy
    has no OpenBLAS with the 64-bit interface and per-thread thread counts."""
    for info in threadpoolctl.threadpool_info():
        if info.get("internal_api") != "openblas" or "openblas64_" not in info.get("filepath", ""):
            continue
        try:
            library = ctypes.CDLL(info["filepath"])
            addresses = {
                ours: ctypes.cast(getattr(library, theirs), ctypes.c_void_p).value
                for ours, theirs in _SYMBOLS.items()
            }
        except (OSError, AttributeError) as e:
            logger.info("numpy's OpenBLAS at %s lacks what CpuAcc calls: %s", info["filepath"], e)
            return False
        for name, address in addresses.items():
            llvmlite.binding.add_symbol(name, address)
        return True
    return False


NUMPY_OPENBLAS = _bind_numpy_openblas()
if not NUMPY_OPENBLAS:
    # Resolvable all the same, since the compiled kernels name both paths.
    _stub = ctypes.CFUNCTYPE(None)(lambda: None)
    for _name in _SYMBOLS:
        llvmlite.binding.add_symbol(_name, ctypes.cast(_stub, ctypes.c_void_p).value)

_vp = types.voidptr
_sgemm64 = types.ExternalFunction("flowrt_sgemm64", types.void(*([_vp] * 13)))
_sgemv64 = types.ExternalFunction("flowrt_sgemv64", types.void(*([_vp] * 11)))

# numba's helpers: int numba_xxgemm(kind, transa, transb, m, n, k, *alpha, *a, lda, *b, ldb,
# *beta, *c, ldc) and int numba_xxgemv(kind, trans, m, n, *alpha, *a, lda, *x, *beta, *y),
# column-major as Fortran BLAS, calling scipy's.
_f32p = types.CPointer(types.float32)
_xxgemm = types.ExternalFunction(
    "numba_xxgemm",
    types.intc(
        types.char, types.char, types.char, types.intp, types.intp, types.intp,
        _f32p, _f32p, types.intp, _f32p, types.intp, _f32p, _f32p, types.intp,
    ),
)  # fmt: skip
_xxgemv = types.ExternalFunction(
    "numba_xxgemv",
    types.intc(types.char, types.char, types.intp, types.intp, _f32p, _f32p, types.intp, _f32p, _f32p, _f32p),
)
_SINGLE = ord("s")


@intrinsic
def _pointer(typingctx, address):
    """An int64 address as a ``void*``."""

    def codegen(context, builder, signature, args):
        return builder.inttoptr(args[0], cgutils.voidptr_t)

    return types.voidptr(types.int64), codegen


@intrinsic
def _float_pointer(typingctx, address):
    """An int64 address as a ``float*``."""

    def codegen(context, builder, signature, args):
        return builder.inttoptr(args[0], context.get_value_type(_f32p))

    return _f32p(types.int64), codegen


# The operands are addresses (int64), not arrays: one compiled specialization serves every
# array type the callers have (layouts, read-only or not), each seconds on a cold cache.
@njit(nogil=True, cache=True)
def gemm(trans_a, trans_b, m, n, k, scalars, a, lda, b, ldb, c, ldc):
    """Column-major ``c = alpha * op(a) @ op(b) + beta * c``, Fortran sgemm's arguments but
    for the operands (the int64 addresses of their first element) and ``scalars`` (alpha,
    beta): ``trans_*`` are the characters N or T."""
    if NUMPY_OPENBLAS:
        ints = np.empty(6, np.int64)
        ints[0] = m
        ints[1] = n
        ints[2] = k
        ints[3] = lda
        ints[4] = ldb
        ints[5] = ldc
        flags = np.empty(2, np.uint8)
        flags[0] = trans_a
        flags[1] = trans_b
        _sgemm64(
            flags[0:].ctypes, flags[1:].ctypes, ints[0:].ctypes, ints[1:].ctypes, ints[2:].ctypes,
            scalars[0:].ctypes, _pointer(a), ints[3:].ctypes, _pointer(b), ints[4:].ctypes,
            scalars[1:].ctypes, _pointer(c), ints[5:].ctypes,
        )  # fmt: skip
    else:
        _xxgemm(
            _SINGLE, trans_a, trans_b, m, n, k, scalars[0:].ctypes, _float_pointer(a), lda, _float_pointer(b),
            ldb, scalars[1:].ctypes, _float_pointer(c), ldc,
        )  # fmt: skip


@njit(nogil=True, cache=True)
def gemv(trans, m, n, scalars, a, lda, x, y):
    """Column-major ``y = alpha * op(a) @ x + beta * y`` with unit increments, as
    :func:`gemm` takes its arguments (``a``, ``x``, ``y``: addresses)."""
    if NUMPY_OPENBLAS:
        ints = np.empty(4, np.int64)
        ints[0] = m
        ints[1] = n
        ints[2] = lda
        ints[3] = 1
        flags = np.empty(1, np.uint8)
        flags[0] = trans
        _sgemv64(
            flags.ctypes, ints[0:].ctypes, ints[1:].ctypes, scalars[0:].ctypes, _pointer(a), ints[2:].ctypes,
            _pointer(x), ints[3:].ctypes, scalars[1:].ctypes, _pointer(y), ints[3:].ctypes,
        )  # fmt: skip
    else:
        _xxgemv(
            _SINGLE, trans, m, n, scalars[0:].ctypes, _float_pointer(a), lda, _float_pointer(x),
            scalars[1:].ctypes, _float_pointer(y),
        )  # fmt: skip
