"""One-input math over a flat window: Exp, Log, Sqrt, Neg, Abs, Reciprocal, Erf, Floor, Ceil,
Round, Sin, Cos and Sign, float32.

Each is a loop of its own (``unary_slice``), so that it vectorizes: exp, log and erf are
``fastmath``'s, the rounding functions and sqrt LLVM's vector instructions. Sin and Cos call
libm per element (numba has no vector sin without SVML). The window is cut as the
activations' (``activation.FlatKernel``).
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

from flowrt.registry import WorkloadInfo
from flowrt.workers.cpu.acc.kernels import acc_kernel, fastmath
from flowrt.workers.cpu.acc.kernels.activation import FlatKernel

EXP, LOG, SQRT, NEG, ABS, RECIPROCAL, ERF, FLOOR, CEIL, ROUND, SIN, COS, SIGN = range(13)
CODES = {
    "Exp": EXP, "Log": LOG, "Sqrt": SQRT, "Neg": NEG, "Abs": ABS, "Reciprocal": RECIPROCAL,
    "Erf": ERF, "Floor": FLOOR, "Ceil": CEIL, "Round": ROUND, "Sin": SIN, "Cos": COS, "Sign": SIGN,
}  # fmt: skip

_ZERO, _ONE = np.float32(0), np.float32(1)


@njit(inline="always", nogil=True, cache=True)
def _sign(v):
    # as np.sign: +0.0 for either zero, NaN for NaN
    return _ONE if v > 0 else -_ONE if v < 0 else _ZERO if v == 0 else v


# error_model="numpy": 1 / 0 is inf, as in numpy, and no check keeps the loops from vectorizing.
@njit(nogil=True, cache=True, error_model="numpy")
def unary_slice(dst, src, code, alpha, beta):
    """``dst = f(src)`` for the function ``code``, one loop per function (``alpha`` and
    ``beta`` are unused: the signature is ``FlatKernel``'s)."""
    n = dst.shape[0]
    if code == EXP:
        for j in range(n):
            dst[j] = fastmath.exp(src[j])
    elif code == LOG:
        for j in range(n):
            dst[j] = fastmath.log(src[j])
    elif code == SQRT:
        for j in range(n):
            dst[j] = math.sqrt(src[j])
    elif code == NEG:
        for j in range(n):
            dst[j] = -src[j]
    elif code == ABS:
        for j in range(n):
            dst[j] = abs(src[j])
    elif code == RECIPROCAL:
        for j in range(n):
            dst[j] = _ONE / src[j]
    elif code == ERF:
        for j in range(n):
            dst[j] = fastmath.erf(src[j])
    elif code == FLOOR:
        for j in range(n):
            dst[j] = np.floor(src[j])
    elif code == CEIL:
        for j in range(n):
            dst[j] = np.ceil(src[j])
    elif code == ROUND:  # half to even, as ONNX and np.round
        for j in range(n):
            dst[j] = np.rint(src[j])
    elif code == SIN:
        for j in range(n):
            dst[j] = math.sin(src[j])
    elif code == COS:
        for j in range(n):
            dst[j] = math.cos(src[j])
    else:
        for j in range(n):
            dst[j] = _sign(src[j])


@acc_kernel(*CODES)
class UnaryKernel(FlatKernel):
    """One math function over every element, split into slices across the CPU workers."""

    run_slice = staticmethod(unary_slice)

    def __init__(self, info: WorkloadInfo, workers: int) -> None:
        super().__init__(info, workers)
        self.code = CODES[info.kind]
