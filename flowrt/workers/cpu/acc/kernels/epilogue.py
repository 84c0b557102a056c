"""Activations as a numba epilogue: the code every CpuAcc kernel uses to apply an activation
to a value before it stores it (a fused activation, or the Activation kernels themselves).

``activation_args(activation)`` turns a ``FusedActivation`` (or None) into the
``(code, alpha, beta)`` triple that :func:`activate` takes inside a jitted loop.
:func:`affine_row` applies one to a whole row after a scale and a shift (:func:`activate_row`
after a bias only), with a loop of its own per activation: LLVM does not vectorize a loop
that branches on the code for every element.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

from flowrt.registry import FusedActivation

NONE, RELU, LEAKY_RELU, CLIP, SIGMOID, TANH = range(6)
# The bias to pass activate_row for none: x + (-0.0) is x for every x, -0.0 included.
NO_BIAS = np.float32(-0.0)
CODES = {"Relu": RELU, "LeakyRelu": LEAKY_RELU, "Clip": CLIP, "Sigmoid": SIGMOID, "Tanh": TANH}


def activation_args(activation: FusedActivation | None) -> tuple[int, np.float32, np.float32]:
    """``(code, alpha, beta)`` for :func:`activate`; ``NONE`` when there is no activation."""
    if activation is None:
        return NONE, np.float32(0), np.float32(0)
    return CODES[activation.kind], np.float32(activation.alpha), np.float32(activation.beta)


@njit(inline="always", nogil=True, cache=True)
def activate(v, code, alpha, beta):
    """``v`` through the activation ``code`` (a branch the compiler hoists out of hot loops)."""
    if code == NONE:
        return v
    if code == RELU:
        # as np.maximum(v, 0): NaN stays NaN, -inf and -0.0 become +0.0
        return v if v > 0 or v != v else np.float32(0)
    if code == LEAKY_RELU:
        return v if v >= 0 else v * alpha
    if code == CLIP:
        return min(max(v, alpha), beta)
    if code == SIGMOID:
        # two branches keep exp() from overflowing for large |v|
        if v >= 0:
            return 1 / (1 + math.exp(-v))
        e = math.exp(v)
        return e / (1 + e)
    return math.tanh(v)


@njit(inline="always", nogil=True, cache=True)
def affine_row(dst, src, a, b, code, alpha, beta):
    """``dst[j] = activate(src[j] * a + b)`` over a row (``dst`` may be ``src``); the branch
    on ``code`` is taken once, so that the loops of the common activations vectorize."""
    # Each loop passes activate() a literal code: inlined, its branch folds away.
    if code == NONE:
        for j in range(dst.shape[0]):
            dst[j] = src[j] * a + b
    elif code == RELU:
        for j in range(dst.shape[0]):
            dst[j] = activate(src[j] * a + b, RELU, alpha, beta)
    elif code == CLIP:
        for j in range(dst.shape[0]):
            dst[j] = activate(src[j] * a + b, CLIP, alpha, beta)
    else:
        for j in range(dst.shape[0]):
            dst[j] = activate(src[j] * a + b, code, alpha, beta)


@njit(inline="always", nogil=True, cache=True)
def activate_row(dst, src, b, code, alpha, beta):
    """``dst[j] = activate(src[j] + b)`` over a row (``dst`` may be ``src``)."""
    # x * 1 is x for every float32 x: the multiply folds away.
    affine_row(dst, src, np.float32(1), b, code, alpha, beta)
