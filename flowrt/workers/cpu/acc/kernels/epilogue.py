"""Activations as a numba epilogue: the code every CpuAcc kernel uses to apply an activation
to a value before it stores it (a fused activation, or the Activation kernels themselves).

``activation_args(activation)`` turns a ``FusedActivation`` (or None) into the
``(code, alpha, beta)`` triple that :func:`activate` takes inside a jitted loop.
:func:`affine_row` applies one to a whole row after a scale and a shift (:func:`activate_row`
after a bias only), with a loop of its own per common activation: LLVM does not vectorize a
loop that branches on the code for every element.

Each curve is also a function of its own, ``curve(v, alpha, beta)`` (``sigmoid``, ``gelu``,
...): a ``fastmath`` intrinsic, straight-line float32 code that a loop over it vectorizes and
that costs numba nothing to inline (the Activation kernels run one loop per curve).

The codes are the activation table's (``flowrt.engine.graph.layer_kind.activation_facts``),
declared with each activation's layer kind; a new activation adds its curve and its branch in
:func:`activate` and :func:`_curve_loops` here. numba compiles a code in as a constant, and
its cache does not see the table change: hence a code, once given, is never changed.
"""

from __future__ import annotations

import numpy as np
from numba import njit, types

from flowrt.engine.graph.layer_kind import NO_ACTIVATION, activation_code, activation_facts
from flowrt.registry import FusedActivation
from flowrt.workers.cpu.acc.calls import LateFunction, call_late
from flowrt.workers.cpu.acc.kernels import fastmath as fm
from flowrt.workers.cpu.acc.kernels.fastmath import Value, where

# Every activation's code, by kind (in code order).
CODES = {kind: fact.code for kind, fact in activation_facts().items()}
NONE = NO_ACTIVATION
RELU, LEAKY_RELU, CLIP, SIGMOID, TANH = (CODES[k] for k in ("Relu", "LeakyRelu", "Clip", "Sigmoid", "Tanh"))
# alpha and beta: HardSigmoid's slope and offset, Elu's and Swish's alpha; Gelu's two forms
# ("none", with erf, and "tanh") have a code each.
HARD_SIGMOID, HARD_SWISH, ELU, SOFTPLUS, GELU, SWISH, MISH, SOFTSIGN = (
    CODES[k] for k in ("HardSigmoid", "HardSwish", "Elu", "Softplus", "Gelu", "Swish", "Mish", "Softsign")
)
GELU_TANH = activation_facts()["Gelu"].variants["tanh"]
# The bias to pass activate_row for none: x + (-0.0) is x for every x, -0.0 included.
NO_BIAS = np.float32(-0.0)


def activation_args(activation: FusedActivation | None) -> tuple[int, np.float32, np.float32]:
    """``(code, alpha, beta)`` for :func:`activate`; ``NONE`` when there is no activation.
    An activation that the kernels apply by :func:`activate_late` is compiled now (at load)."""
    if activation is None:
        return NONE, np.float32(0), np.float32(0)
    code = activation_code(activation)
    if code not in (RELU, CLIP):
        ACTIVATE_SLICE.address()
    return code, np.float32(activation.alpha), np.float32(activation.beta)


# The curves: CpuRef's formulas in float32, as selects (no branch, no libm call).
def _relu(v: Value, alpha: Value, beta: Value) -> Value:
    # as np.maximum(v, 0): NaN stays NaN, -inf and -0.0 become +0.0. v + 0.0 is v wherever
    # it is chosen, but in place (row[j] = relu(row[j])) it keeps LLVM from turning the store
    # of an unchanged v into a conditional store of 0.0, which AVX2 does not vectorize (5x).
    return where((v > 0.0) | (v != v), v + 0.0, 0.0)


def _leaky_relu(v: Value, alpha: Value, beta: Value) -> Value:
    return where(v >= 0.0, v, v * alpha)


def _sigmoid(v: Value, alpha: Value, beta: Value) -> Value:
    return fm.sigmoid_of(v)


def _tanh(v: Value, alpha: Value, beta: Value) -> Value:
    return fm.tanh_of(v)


def _hard_sigmoid(v: Value, alpha: Value, beta: Value) -> Value:
    return fm.clamp(v * alpha + beta, 0.0, 1.0)


def _hard_swish(v: Value, alpha: Value, beta: Value) -> Value:
    return v * fm.clamp(v * (1 / 6) + 0.5, 0.0, 1.0)


def _elu(v: Value, alpha: Value, beta: Value) -> Value:
    return where(v > 0.0, v, alpha * fm.expm1_of(v))


def _softplus(v: Value, alpha: Value, beta: Value) -> Value:
    return fm.softplus_of(v)


def _gelu(v: Value, alpha: Value, beta: Value) -> Value:
    return v * 0.5 * (fm.erf_of(v * float(np.sqrt(0.5))) + 1.0)


def _gelu_tanh(v: Value, alpha: Value, beta: Value) -> Value:
    inner = (v + v * v * v * 0.044715) * float(np.sqrt(2 / np.pi))
    return v * 0.5 * (fm.tanh_of(inner) + 1.0)


def _swish(v: Value, alpha: Value, beta: Value) -> Value:
    return v * fm.sigmoid_of(v * alpha)


def _mish(v: Value, alpha: Value, beta: Value) -> Value:
    # v tanh(log(1 + e)) = v n / (n + 2) with n = e (e + 2), e = exp(v); n overflows beyond
    # 20, where the factor is 1.0 in float32 already.
    e = fm.exp_of(v)
    n = e * (e + 2.0)
    return where(v > 20.0, v, v * (n / (n + 2.0)))


def _softsign(v: Value, alpha: Value, beta: Value) -> Value:
    return v / (fm.fabs(v) + 1.0)


relu, leaky_relu, clip, sigmoid, tanh = map(
    fm.float32_function, (_relu, _leaky_relu, fm.clamp, _sigmoid, _tanh)
)
hard_sigmoid, hard_swish, elu, softplus = map(
    fm.float32_function, (_hard_sigmoid, _hard_swish, _elu, _softplus)
)
gelu, gelu_tanh, swish, mish, softsign = map(
    fm.float32_function, (_gelu, _gelu_tanh, _swish, _mish, _softsign)
)


@njit(inline="always", nogil=True, cache=True)
def activate(v, code, alpha, beta):
    """``v`` through the activation ``code`` (a branch the compiler hoists out of hot loops)."""
    if code == NONE:
        return v
    if code == RELU:
        return relu(v, alpha, beta)
    if code == LEAKY_RELU:
        return leaky_relu(v, alpha, beta)
    if code == CLIP:
        return clip(v, alpha, beta)
    if code == SIGMOID:
        return sigmoid(v, alpha, beta)
    if code == TANH:
        return tanh(v, alpha, beta)
    if code == HARD_SIGMOID:
        return hard_sigmoid(v, alpha, beta)
    if code == HARD_SWISH:
        return hard_swish(v, alpha, beta)
    if code == ELU:
        return elu(v, alpha, beta)
    if code == SOFTPLUS:
        return softplus(v, alpha, beta)
    if code == GELU:
        return gelu(v, alpha, beta)
    if code == GELU_TANH:
        return gelu_tanh(v, alpha, beta)
    if code == SWISH:
        return swish(v, alpha, beta)
    if code == SOFTSIGN:
        return softsign(v, alpha, beta)
    return mish(v, alpha, beta)


@njit(inline="always", nogil=True, cache=True, error_model="numpy")
def _curve_loops(dst, src, code, alpha, beta):
    """``dst = activate(src)`` with one loop per code over that code's curve (an intrinsic,
    so that numba has nothing to inline and each loop vectorizes)."""
    n = dst.shape[0]
    if code == RELU:
        for j in range(n):
            dst[j] = relu(src[j], alpha, beta)
    elif code == LEAKY_RELU:
        for j in range(n):
            dst[j] = leaky_relu(src[j], alpha, beta)
    elif code == CLIP:
        for j in range(n):
            dst[j] = clip(src[j], alpha, beta)
    elif code == SIGMOID:
        for j in range(n):
            dst[j] = sigmoid(src[j], alpha, beta)
    elif code == TANH:
        for j in range(n):
            dst[j] = tanh(src[j], alpha, beta)
    elif code == HARD_SIGMOID:
        for j in range(n):
            dst[j] = hard_sigmoid(src[j], alpha, beta)
    elif code == HARD_SWISH:
        for j in range(n):
            dst[j] = hard_swish(src[j], alpha, beta)
    elif code == ELU:
        for j in range(n):
            dst[j] = elu(src[j], alpha, beta)
    elif code == SOFTPLUS:
        for j in range(n):
            dst[j] = softplus(src[j], alpha, beta)
    elif code == GELU:
        for j in range(n):
            dst[j] = gelu(src[j], alpha, beta)
    elif code == GELU_TANH:
        for j in range(n):
            dst[j] = gelu_tanh(src[j], alpha, beta)
    elif code == SWISH:
        for j in range(n):
            dst[j] = swish(src[j], alpha, beta)
    elif code == MISH:
        for j in range(n):
            dst[j] = mish(src[j], alpha, beta)
    elif code == SOFTSIGN:
        for j in range(n):
            dst[j] = softsign(src[j], alpha, beta)
    else:  # a loop, not dst[:] = src: that compiles numba's error formatting (seconds)
        for j in range(n):
            dst[j] = src[j]


# error_model="numpy": no division-by-zero check, which would keep the loops from vectorizing.
@njit(nogil=True, cache=True, error_model="numpy")
def activate_slice(dst, src, code, alpha, beta):
    """``dst = activate(src)`` (``dst`` may be ``src``, and is for :func:`activate_late`)."""
    if dst.ctypes.data == src.ctypes.data:
        # One array for both: LLVM vectorizes a loop only where it can rule out that dst
        # and src overlap, and two views of one row overlap (sigmoid in place: 8x slower).
        _curve_loops(dst, dst, code, alpha, beta)
    else:
        _curve_loops(dst, src, code, alpha, beta)


_ROW = types.Array(types.float32, 1, "C")
ACTIVATE_SLICE_NAME = "flowrt_activate_slice"
ACTIVATE_SLICE = LateFunction(
    activate_slice, (_ROW, _ROW, types.int64, types.float32, types.float32), ACTIVATE_SLICE_NAME
)


@njit(inline="always", nogil=True, cache=True)
def affine_row(dst, src, a, b, code, alpha, beta):
    """``dst[j] = activate(src[j] * a + b)`` over a row (``dst`` may be ``src``; ``dst`` has
    unit stride): one loop for none, Relu and Clip; any other activation is a second pass
    over ``dst`` (:func:`activate_late`), so that every loop vectorizes."""
    # Each loop calls its curve, not activate(): inlining activate's fifteen branches at
    # each loop cost every kernel using this a second of compile time on a cold cache.
    if code == RELU:
        for j in range(dst.shape[0]):
            dst[j] = relu(src[j] * a + b, alpha, beta)
    elif code == CLIP:
        for j in range(dst.shape[0]):
            dst[j] = clip(src[j] * a + b, alpha, beta)
    else:
        for j in range(dst.shape[0]):
            dst[j] = src[j] * a + b
        if code != NONE:
            activate_late(dst, code, alpha, beta)


@njit(inline="always", nogil=True, cache=True)
def activate_late(row, code, alpha, beta):
    """``row = activate(row)`` (a 1-D float32 row with unit stride) by :func:`activate_slice`,
    called through its slot (``ACTIVATE_SLICE``): a kernel that only might need an activation
    other than Relu and Clip neither compiles nor links it."""
    call_late(ACTIVATE_SLICE_NAME, (row, row, np.int64(code), np.float32(alpha), np.float32(beta)))


@njit(inline="always", nogil=True, cache=True)
def activate_in_place(row, code, alpha, beta):
    """``row = activate(row)`` over a row with unit stride, in one pass: Relu and Clip here,
    any other curve through :func:`activate_late`; nothing for none. (:func:`activate_row`
    with no bias would first copy the row onto itself.)"""
    if code == RELU:
        for j in range(row.shape[0]):
            row[j] = relu(row[j], alpha, beta)
    elif code == CLIP:
        for j in range(row.shape[0]):
            row[j] = clip(row[j], alpha, beta)
    elif code != NONE:
        activate_late(row, code, alpha, beta)


# Fewest values :func:`activate_planes` activates in one pass: a kernel that writes small
# planes one after another (7x7: 49 values) activated each on its own, and the vectorized
# loop, 64 values an iteration, left them to its one-at-a-time remainder.
ACTIVATE_BLOCK = 1024


@njit(inline="always", nogil=True, cache=True)
def activate_planes(flat, pending, end, last, code, alpha, beta):
    """The values ``flat[pending:end]`` (planes written one after another since the last
    pass) activated in one pass once they are ACTIVATE_BLOCK or more, or at the ``last``
    plane: where the next pass starts."""
    if code == NONE:
        return end
    if end - pending < ACTIVATE_BLOCK and not last:
        return pending
    activate_in_place(flat[pending:end], code, alpha, beta)
    return end


@njit(inline="always", nogil=True, cache=True)
def activate_row(dst, src, b, code, alpha, beta):
    """``dst[j] = activate(src[j] + b)`` over a row (``dst`` may be ``src``)."""
    # x * 1 is x for every float32 x: the multiply folds away.
    affine_row(dst, src, np.float32(1), b, code, alpha, beta)
