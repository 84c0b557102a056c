"""float32 exp, expm1, log, tanh, sigmoid, softplus and erf that LLVM vectorizes: range
reduction, a polynomial, and selects instead of branches, as Cephes' single-precision
functions and Eigen's packet math.

numba without Intel's SVML calls libm's scalar ``expf`` per element, which keeps a loop from
vectorizing. Each function here is a numba intrinsic that writes its straight-line float32
IR where it is called: the loop around it vectorizes, eight lanes at a time on AVX2, and
numba has nothing to type or inline. (Nested ``@njit(inline="always")`` helpers made a kernel
of every activation take minutes to compile; a plain ``@njit`` one is left uninlined by LLVM
once it outgrows LLVM's threshold, and then the loop does not vectorize.)

The functions are written once, in Python, over :class:`Value` (whose operators emit the
IR), and :func:`float32_function` makes each an intrinsic taking float32 arguments. exp and
log are within 1 ulp of the exact result, tanh and expm1 within 2, sigmoid and softplus
within 2.5, erf within 4e-7 (6 ulp of 1); each gives what numpy gives for NaN, the
infinities, overflow, underflow (subnormal results included) and -0.0.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np
from llvmlite import ir
from numba import types
from numba.extending import intrinsic

_F32, _I32 = ir.FloatType(), ir.IntType(32)


class Value:
    """A float32 (or, from a comparison, a boolean) being computed in LLVM IR at an
    intrinsic's call site; Python numbers mix in as float32 constants."""

    __slots__ = ("builder", "ir")
    __hash__ = None  # type: ignore[assignment]  # == builds IR, so a Value is not hashable

    def __init__(self, builder: ir.IRBuilder, value: ir.Value) -> None:
        self.builder, self.ir = builder, value

    def lift(self, other: Value | float) -> ir.Value:
        """``other`` as IR: a constant when it is a number."""
        return other.ir if isinstance(other, Value) else ir.Constant(_F32, float(np.float32(other)))

    def _op(self, name: str, a: Value | float, b: Value | float) -> Value:
        instruction = getattr(self.builder, name)(self.lift(a), self.lift(b))
        # "contract": LLVM may fuse a multiply and the add after it into one FMA (rounded
        # once, so no less accurate): a third fewer instructions in each curve's polynomial.
        instruction.flags.append("contract")
        return Value(self.builder, instruction)

    def __add__(self, o):
        return self._op("fadd", self, o)

    def __radd__(self, o):
        return self._op("fadd", o, self)

    def __sub__(self, o):
        return self._op("fsub", self, o)

    def __rsub__(self, o):
        return self._op("fsub", o, self)

    def __mul__(self, o):
        return self._op("fmul", self, o)

    def __rmul__(self, o):
        return self._op("fmul", o, self)

    def __truediv__(self, o):
        return self._op("fdiv", self, o)

    def __rtruediv__(self, o):
        return self._op("fdiv", o, self)

    def __neg__(self):
        return Value(self.builder, self.builder.fneg(self.ir))

    # Ordered comparisons are false when either side is NaN; != is true.
    def _compare(self, op: str, o, ordered: bool = True) -> Value:
        compare = self.builder.fcmp_ordered if ordered else self.builder.fcmp_unordered
        return Value(self.builder, compare(op, self.ir, self.lift(o)))

    def __lt__(self, o):
        return self._compare("<", o)

    def __le__(self, o):
        return self._compare("<=", o)

    def __gt__(self, o):
        return self._compare(">", o)

    def __ge__(self, o):
        return self._compare(">=", o)

    def __eq__(self, o):
        return self._compare("==", o)

    def __ne__(self, o):
        return self._compare("!=", o, ordered=False)

    def __or__(self, o):
        return Value(self.builder, self.builder.or_(self.ir, o.ir))


def where(condition: Value, a: Value | float, b: Value | float) -> Value:
    """``a`` where ``condition`` holds, else ``b`` (a select: both are computed)."""
    return Value(
        condition.builder, condition.builder.select(condition.ir, condition.lift(a), condition.lift(b))
    )


def clamp(x: Value, low: Value | float, high: Value | float) -> Value:
    """``x`` clamped to [low, high], NaN kept and high winning when low > high, as np.clip."""
    x = where(x < low, low, x)
    return where(x > high, high, x)


def fabs(x: Value) -> Value:
    """``|x|`` (llvm.fabs: -0.0 and -NaN lose their sign)."""
    fn = x.builder.module.declare_intrinsic("llvm.fabs", [_F32])
    return Value(x.builder, x.builder.call(fn, [x.ir]))


def horner(x: Value, coefficients: Sequence[float]) -> Value:
    """The polynomial with ``coefficients`` (highest power first) at ``x``."""
    p = x * coefficients[0] + coefficients[1]
    for c in coefficients[2:]:
        p = p * x + c
    return p


def _bits(x: Value) -> ir.Value:
    return x.builder.bitcast(x.ir, _I32)


def _from_bits(x: Value, bits: ir.Value) -> Value:
    return Value(x.builder, x.builder.bitcast(bits, _F32))


# Adding 1.5 * 2**23 to a float32 of magnitude below 2**22 rounds it to an integer, which the
# low bits of the sum then hold; subtracting it again gives that integer as a float.
_ROUNDER = 12582912.0
_ROUNDER_BITS = 0x4B400000


def rint(x: Value) -> Value:
    """``x`` rounded to an integer (half to even), for |x| < 2**22."""
    return (x + _ROUNDER) - _ROUNDER


def pow2(n: Value) -> Value:
    """``2.0 ** n`` for an integral ``n`` in [-126, 127], made from exponent bits (no
    float-to-int conversion, which LLVM may treat as poison for a NaN)."""
    b = n.builder
    biased = b.add(_bits(n + _ROUNDER), ir.Constant(_I32, 127 - _ROUNDER_BITS))
    return _from_bits(n, b.shl(biased, ir.Constant(_I32, 23)))


def float32_function(build: Callable[..., Value]):
    """``build`` (over :class:`Value` arguments) as a numba intrinsic taking float32
    arguments (any other float or integer is cast) and returning a float32."""

    def typer(typingctx, args):
        if not all(isinstance(a, (types.Float, types.Integer)) for a in args):
            return None

        def codegen(context, builder, signature, values):
            cast = [context.cast(builder, v, t, types.float32) for v, t in zip(values, signature.args)]
            return build(*(Value(builder, v) for v in cast)).ir

        return types.float32(*args), codegen

    # numba lowers no *args intrinsic: one typing function per arity
    arity = build.__code__.co_argcount
    fn: Callable[..., object]
    if arity == 1:
        fn = lambda typingctx, x: typer(typingctx, (x,))  # noqa: E731
    elif arity == 2:
        fn = lambda typingctx, x, y: typer(typingctx, (x, y))  # noqa: E731
    elif arity == 3:
        fn = lambda typingctx, x, a, b: typer(typingctx, (x, a, b))  # noqa: E731
    else:
        raise TypeError(f"float32_function takes 1 to 3 arguments, {build.__name__} has {arity}")
    fn.__name__ = fn.__qualname__ = build.__name__.removesuffix("_of")
    fn.__doc__ = build.__doc__
    return intrinsic(fn)


def maxnum_of(x: Value, y: Value) -> Value:
    """The larger of ``x`` and ``y``, the other one where one is NaN (LLVM's ``maxnum``, C's
    fmaxf): a loop keeping the largest element by it vectorizes, where one by a compare and a
    select stays scalar (LLVM takes such a select for a max only in a function free of NaNs)."""
    b = x.builder
    module = b.module
    function = module.globals.get("llvm.maxnum.f32") or ir.Function(
        module, ir.FunctionType(_F32, [_F32, _F32]), "llvm.maxnum.f32"
    )
    return Value(b, b.call(function, [x.ir, y.ir]))


# exp: x = n ln2 + r, |r| <= ln2 / 2, with ln2 in two parts (Cody and Waite) so that n ln2 is
# exact; exp(r) by Cephes expf's polynomial. Outside [-104, 89] exp is 0 or inf in float32.
_LOG2E = 1.44269504088896341
_LN2_HI, _LN2_LO = 0.693359375, -2.12194440e-4
_EXP_LO, _EXP_HI = -104.0, 89.0
_EXP_POLY = (1.9875691500e-4, 1.3981999507e-3, 8.3334519073e-3, 4.1665795894e-2,
             1.6666665459e-1, 5.0000001201e-1)  # fmt: skip


def exp_of(x: Value) -> Value:
    """``e ** x``, as numpy's float32 exp."""
    # At or below _EXP_LO the result is 0: those lanes compute exp(0) instead, since a
    # multiply into the subnormals costs a microcode assist on many cores (an attention
    # mask's -3.4e38 made a Softmax 2.6x slower). NaN goes through.
    zero = x <= _EXP_LO
    x = where(zero, 0.0, clamp(x, _EXP_LO, _EXP_HI))
    n = rint(x * _LOG2E)
    r = (x - n * _LN2_HI) - n * _LN2_LO
    p = horner(r, _EXP_POLY) * (r * r) + r + 1.0
    # 2**n in two factors, so that n from -150 (a subnormal result) to 128 (just below
    # overflow) needs no special case; only the second multiply rounds.
    half = rint(n * 0.5)
    return where(zero, 0.0, (p * pow2(half)) * pow2(n - half))


# 2**-64: e**y below 2**-100 is made as (p 2**(n + 64)) 2**-64, a normal product rounded once
# into the subnormals by the second multiply.
_TINY_SHIFT = 64.0
_TINY_SCALE = 5.421010862427522e-20


def exp_nonpositive_of(x: Value) -> Value:
    """``e ** x`` for ``x`` <= 0 (or NaN), as :func:`exp_of`, in a third fewer instructions:
    no upper clamp, one power of two where the result is normal, and no lanes forced to 0
    (at -104 and below the product rounds to 0 by itself). The curves built on e ** -|x|
    (sigmoid, and so swish, and softplus) call it, few of their inputs being that negative."""
    x = where(x < _EXP_LO, _EXP_LO, x)
    n = rint(x * _LOG2E)
    r = (x - n * _LN2_HI) - n * _LN2_LO
    p = horner(r, _EXP_POLY) * (r * r) + r + 1.0
    tiny = n < -100.0
    return (p * pow2(where(tiny, n + _TINY_SHIFT, n))) * where(tiny, _TINY_SCALE, 1.0)


# expm1 near 0, where exp(x) - 1 cancels: its Taylor series to x**10 (relative error below
# 1e-9 for |x| < 0.7), as x * (1 + x * (...)) so that -0.0 stays -0.0.
_EXPM1_NEAR_ZERO = 0.7
_EXPM1_POLY = tuple(1 / math.factorial(k) for k in range(10, 1, -1))


def expm1_of(x: Value) -> Value:
    """``e ** x - 1``, accurate near 0 as numpy's expm1."""
    small = x * (horner(x, _EXPM1_POLY) * x + 1.0)
    return where(fabs(x) < _EXPM1_NEAR_ZERO, small, exp_of(x) - 1.0)


# log: x = 2**e m with m in [sqrt(1/2), sqrt(2)); log(m) = f - f**2 / 2 + f**3 P(f) with
# f = m - 1 (exact), by Cephes logf's polynomial; e ln2 added in two parts as in exp.
_SQRT2 = 1.41421356
_MIN_NORMAL, _SUBNORMAL_SCALE = 1.17549435e-38, 8388608.0
_LOG_POLY = (7.0376836292e-2, -1.1514610310e-1, 1.1676998740e-1, -1.2420140846e-1,
             1.4249322787e-1, -1.6668057665e-1, 2.0000714765e-1, -2.4999993993e-1,
             3.3333331174e-1)  # fmt: skip


def _exponent_and_significand(x: Value) -> tuple[Value, Value]:
    """A positive normal ``x`` as ``(e, m)``: x = 2**e m, m in [1, 2), e a float."""
    b = x.builder
    field = b.and_(b.lshr(_bits(x), ir.Constant(_I32, 23)), ir.Constant(_I32, 0xFF))
    e = Value(b, b.sitofp(field, _F32)) - 127.0
    fraction = b.and_(_bits(x), ir.Constant(_I32, 0x007FFFFF))
    return e, _from_bits(x, b.or_(fraction, ir.Constant(_I32, 0x3F800000)))


def log_of(x: Value) -> Value:
    """The natural log, as numpy's: -inf at either zero, NaN below, inf at inf."""
    subnormal = x < _MIN_NORMAL
    e, m = _exponent_and_significand(where(subnormal, x * _SUBNORMAL_SCALE, x))
    e = where(subnormal, e - 23.0, e)
    big = m > _SQRT2
    m = where(big, m * 0.5, m)
    e = where(big, e + 1.0, e)
    f = m - 1.0
    z = f * f
    r = horner(f, _LOG_POLY) * f * z + e * _LN2_LO - z * 0.5
    r = (f + r) + e * _LN2_HI
    r = where(x == 0.0, -math.inf, where(x < 0.0, math.nan, r))
    return where((x == math.inf) | (x != x), x, r)


def softplus_of(x: Value) -> Value:
    """``log(1 + e ** x)`` without overflow: max(x, 0) + log1p(e ** -|x|), as np.logaddexp."""
    e = exp_nonpositive_of(-fabs(x))
    u = e + 1.0
    # log1p(e) = log(u) + log(1 + (e - (u - 1)) / u): the second term, to first order,
    # restores what rounding 1 + e lost (u - 1 is exact); it is all of log1p(e) when u is 1.
    return where(x > 0.0, x, 0.0) + (log_of(u) + (e - (u - 1.0)) / u)


# tanh: an odd polynomial below 0.625 (Cephes tanhf), 1 - 2 / (e**2|x| + 1) above.
_TANH_NEAR_ZERO = 0.625
_TANH_POLY = (-5.70498872745e-3, 2.06390887954e-2, -5.37397155531e-2, 1.33314422036e-1,
              -3.33332819422e-1)  # fmt: skip


def tanh_of(x: Value) -> Value:
    """The hyperbolic tangent (-0.0 stays -0.0)."""
    a = fabs(x)
    z = x * x
    small = x * (horner(z, _TANH_POLY) * z + 1.0)  # x * (1 + ...): -0.0 stays -0.0
    large = 1.0 - 2.0 / (exp_of(a + a) + 1.0)
    return where(a < _TANH_NEAR_ZERO, small, where(x < 0.0, -large, large))


def sigmoid_of(x: Value) -> Value:
    """``1 / (1 + e ** -x)`` from e = e ** -|x|, which never overflows; ``e / (1 + e)`` below
    0, so that it reaches the subnormals as CpuRef's does."""
    e = exp_nonpositive_of(-fabs(x))
    s = 1.0 / (e + 1.0)
    return where(x >= 0.0, s, e * s)


# erf: Eigen's generic_fast_erf_float, a 9/12-degree rational function, +-1 beyond
# erfinv(1 - 2**-23); x is clamped first so that the denominator stays positive.
_ERF_ONE = 3.832506856900711
_ERF_P = (0.00022905065861350646, 0.0034082910107109506, 0.050955695062380861,
          0.18520832239976145, 1.128379143519084)  # fmt: skip
_ERF_Q = (-1.1791602954361697e-7, 0.000023547966471313185, 0.0010179625278914885,
          0.014070470171167667, 0.11098505178285362, 0.49746925110067538, 1.0)  # fmt: skip


def erf_of(x: Value) -> Value:
    """The error function."""
    c = clamp(x, -_ERF_ONE, _ERF_ONE)
    z = c * c
    ratio = horner(z, _ERF_P) * c / horner(z, _ERF_Q)
    return where(fabs(x) >= _ERF_ONE, where(x > 0.0, 1.0, -1.0), ratio)


exp = float32_function(exp_of)
exp_nonpositive = float32_function(exp_nonpositive_of)
maxnum = float32_function(maxnum_of)
expm1 = float32_function(expm1_of)
log = float32_function(log_of)
softplus = float32_function(softplus_of)
tanh = float32_function(tanh_of)
sigmoid = float32_function(sigmoid_of)
erf = float32_function(erf_of)
clip = float32_function(clamp)
