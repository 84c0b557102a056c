"""Elementwise kernels: unary math, broadcasting binary ops and comparisons, Max/Min/Sum/Mean,
Where, Identity and Dropout (Cast and CastLike are in ``cast.py``).

Like onnx's reference ops, each op hands one numpy function to a shared base; the base keeps the
ONNX output dtype (numpy would upcast float16 or mixed operands) and silences the floating-point
warnings that NaN and inf results legitimately raise.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from flowrt.engine.graph.layers.elementwise import check_dropout_inference, legacy_b_shape
from flowrt.workers.cpu.ref.kernels import ref_kernel

# W. J. Cody's rational Chebyshev fits ("Rational Chebyshev approximations for the error
# function", Math. Comp. 23, 1969; netlib specfun CALERF), highest power first for np.polyval.
_ERF_SMALL = ((1.85777706184603153e-1, 3.16112374387056560e0, 1.13864154151050156e2,
               3.77485237685302021e2, 3.20937758913846947e3),
              (1.0, 2.36012909523441209e1, 2.44024637934444173e2, 1.28261652607737228e3,
               2.84423683343917062e3))  # fmt: skip
_ERFC_MIDDLE = ((2.15311535474403846e-8, 5.64188496988670089e-1, 8.88314979438837594e0,
                 6.61191906371416295e1, 2.98635138197400131e2, 8.81952221241769090e2,
                 1.71204761263407058e3, 2.05107837782607147e3, 1.23033935479799725e3),
                (1.0, 1.57449261107098347e1, 1.17693950891312499e2, 5.37181101862009858e2,
                 1.62138957456669019e3, 3.29079923573345963e3, 4.36261909014324716e3,
                 3.43936767414372164e3, 1.23033935480374942e3))  # fmt: skip
_ERFC_TAIL = ((1.63153871373020978e-2, 3.05326634961232344e-1, 3.60344899949804439e-1,
               1.25781726111229246e-1, 1.60837851487422766e-2, 6.58749161529837803e-4),
              (1.0, 2.56852019228982242e0, 1.87295284992346047e0, 5.27905102951428412e-1,
               6.05183413124413191e-2, 2.33520497626869185e-3))  # fmt: skip


def _rational(fit: tuple[tuple[float, ...], tuple[float, ...]], t: np.ndarray) -> np.ndarray:
    return np.polyval(fit[0], t) / np.polyval(fit[1], t)


def erf(x: np.ndarray) -> np.ndarray:
    """The error function in float64, vectorized (numpy has none and the engine avoids scipy).

    Cody's three rational fits: one of erf for |x| <= 0.46875, two of erfc beyond, giving
    erf = 1 - erfc there; error within a few float64 epsilons.
    """
    x = np.asarray(x, dtype=np.float64)
    y = np.abs(x)
    out = np.empty_like(x)
    small, middle = y <= 0.46875, (y > 0.46875) & (y <= 4.0)
    tail = ~(small | middle)  # NaN lands here and stays NaN
    out[small] = x[small] * _rational(_ERF_SMALL, x[small] ** 2)
    ym, yt = y[middle], y[tail]
    erfc_middle = np.exp(-ym * ym) * _rational(_ERFC_MIDDLE, ym)
    inv2 = 1.0 / (yt * yt)
    erfc_tail = np.exp(-yt * yt) / yt * (1 / np.sqrt(np.pi) - inv2 * _rational(_ERFC_TAIL, inv2))
    out[middle] = np.copysign(1.0 - erfc_middle, x[middle])
    out[tail] = np.copysign(1.0 - erfc_tail, x[tail])
    return out


def same_dtype(fn: Callable[..., np.ndarray]) -> Callable[..., np.ndarray]:
    """A kernel applying ``fn`` to its inputs, with the first input's dtype and numpy's
    floating-point warnings silenced (NaN and inf are valid results)."""

    def kernel(desc, x, *rest):
        with np.errstate(all="ignore"):
            return np.asarray(fn(x, *rest)).astype(x.dtype, copy=False)

    return kernel


_UNARY: dict[str, Callable[..., np.ndarray]] = {
    "Exp": np.exp, "Log": np.log, "Sqrt": np.sqrt, "Neg": np.negative, "Abs": np.abs,
    "Reciprocal": np.reciprocal, "Floor": np.floor, "Ceil": np.ceil, "Round": np.round, "Sign": np.sign,
    "Erf": erf, "Sin": np.sin, "Cos": np.cos, "Tan": np.tan, "Asin": np.arcsin, "Acos": np.arccos,
    "Atan": np.arctan, "Sinh": np.sinh, "Cosh": np.cosh, "Asinh": np.arcsinh, "Acosh": np.arccosh,
    "Atanh": np.arctanh, "Not": np.logical_not,
}  # fmt: skip
for _name, _fn in _UNARY.items():
    ref_kernel(_name)(same_dtype(_fn))


@ref_kernel("IsNaN")
def is_nan(desc, x):
    return np.asarray(np.isnan(x))


@ref_kernel("IsInf")
def is_inf(desc, x):
    positive = np.isposinf(x) if desc.detect_positive else np.zeros(x.shape, bool)
    return np.asarray(positive | np.isneginf(x) if desc.detect_negative else positive)


@ref_kernel("Identity")
def identity(desc, x):
    return x


@ref_kernel("Dropout")
def dropout(desc, x, ratio=None, training_mode=None):
    check_dropout_inference(ratio, training_mode)
    if desc.num_outputs == 1:
        return x
    return x, np.ones(x.shape, dtype=bool if desc.opset >= 10 else x.dtype)


def truncating_divide(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Division as ONNX defines it: integers truncate toward zero, as in C."""
    if a.dtype.kind not in "iu":
        return np.divide(a, b)
    quotient = np.floor_divide(a, b)
    inexact_negative = (np.remainder(a, b) != 0) & ((a < 0) ^ (b < 0))
    return quotient + inexact_negative.astype(quotient.dtype)


def bit_shift(a: np.ndarray, b: np.ndarray, left: bool) -> np.ndarray:
    """Shift ``a`` by ``b`` bits; shifts outside [0, bit width) give 0 (-1 for a negative
    value shifted right), which numpy leaves undefined."""
    a, b = np.broadcast_arrays(a, b)
    valid = (b >= 0) & (b < a.dtype.itemsize * 8)
    shift = np.where(valid, b, 0)
    if left:
        # Shift signed values as their unsigned bit pattern so overflow wraps instead of failing.
        unsigned = np.dtype(f"u{a.dtype.itemsize}")
        shifted = np.left_shift(a.view(unsigned), shift.astype(unsigned)).view(a.dtype)
        return np.where(valid, shifted, 0).astype(a.dtype)
    fill = np.where(a < 0, -1, 0) if a.dtype.kind == "i" else 0
    return np.where(valid, np.right_shift(a, shift), fill).astype(a.dtype)


_BINARY: dict[str, Callable[[np.ndarray, np.ndarray], np.ndarray]] = {
    "Add": np.add, "Sub": np.subtract, "Mul": np.multiply, "Div": truncating_divide,
    "Pow": np.power, "And": np.logical_and, "Or": np.logical_or, "Xor": np.logical_xor,
    "Equal": np.equal, "Less": np.less, "Greater": np.greater,
    "LessOrEqual": np.less_equal, "GreaterOrEqual": np.greater_equal,
}  # fmt: skip
_COMPARISONS = {"Equal", "Less", "Greater", "LessOrEqual", "GreaterOrEqual"}


def binary_kernel(fn: Callable[[np.ndarray, np.ndarray], np.ndarray], keep_dtype: bool) -> Callable:
    """A broadcasting binary kernel; reshapes B by the pre-opset-7 rule when the descriptor asks."""

    def kernel(desc, a, b):
        if getattr(desc, "legacy", False):
            b = b.reshape(legacy_b_shape(a.shape, b.shape, desc))
        with np.errstate(all="ignore"):
            result = fn(a, b)
        return np.asarray(result).astype(a.dtype, copy=False) if keep_dtype else np.asarray(result)

    return kernel


for _name, _fn in _BINARY.items():
    ref_kernel(_name)(binary_kernel(_fn, keep_dtype=_name not in _COMPARISONS))


@ref_kernel("Mod")
def mod(desc, a, b):
    with np.errstate(all="ignore"):
        return np.asarray((np.fmod if desc.fmod else np.mod)(a, b)).astype(a.dtype, copy=False)


@ref_kernel("BitShift")
def bitshift(desc, a, b):
    return bit_shift(a, b, left=desc.direction == "LEFT")


def variadic_kernel(fn: Callable[[np.ndarray, np.ndarray], np.ndarray]) -> Callable:
    """Fold ``fn`` over any number of broadcasting inputs, keeping the first input's dtype."""

    def kernel(desc, first, *rest):
        result = first
        for x in rest:
            result = fn(result, x)
        return np.asarray(result).astype(first.dtype, copy=False)

    return kernel


ref_kernel("Max")(variadic_kernel(np.maximum))
ref_kernel("Min")(variadic_kernel(np.minimum))
ref_kernel("Sum")(variadic_kernel(np.add))


@ref_kernel("Mean")
def mean(desc, *inputs):
    total = variadic_kernel(np.add)(desc, *inputs)
    return np.asarray(total / len(inputs)).astype(inputs[0].dtype, copy=False)


@ref_kernel("Where")
def where(desc, condition, x, y):
    return np.where(condition, x, y)
