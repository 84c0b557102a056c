"""Activation kernels: each op is one numpy expression over a shared base that keeps the
input's dtype and silences the overflow warnings exp raises on large inputs."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from flowrt.engine.graph.layers.activation import prelu_slope_shape
from flowrt.workers.cpu.ref.kernels import ref_kernel
from flowrt.workers.cpu.ref.kernels.elementwise import erf


def activation(*names: str) -> Callable:
    """Register ``fn(desc, x)`` as the kernel of ``names``, its result cast back to x's dtype."""

    def register(fn: Callable[..., np.ndarray]) -> Callable:
        def kernel(desc, x, *rest):
            with np.errstate(all="ignore"):
                return np.asarray(fn(desc, x, *rest)).astype(x.dtype, copy=False)

        ref_kernel(*names)(kernel)
        return fn

    return register


def sigmoid(x: np.ndarray) -> np.ndarray:
    """Logistic sigmoid that never overflows: exp only ever sees -|x|."""
    e = np.exp(-np.abs(x))
    return np.where(x >= 0, 1 / (1 + e), e / (1 + e))


def softplus(x: np.ndarray) -> np.ndarray:
    """log(1 + exp(x)) without overflow."""
    return np.logaddexp(np.zeros((), x.dtype), x)


activation("Relu")(lambda desc, x: np.maximum(x, 0))
activation("LeakyRelu")(lambda desc, x: np.where(x > 0, x, x * desc.alpha))
activation("Elu")(lambda desc, x: np.where(x > 0, x, desc.alpha * np.expm1(x)))
activation("Selu")(lambda desc, x: desc.gamma * np.where(x > 0, x, desc.alpha * np.expm1(x)))
activation("Celu")(lambda desc, x: np.maximum(x, 0) + np.minimum(0, desc.alpha * np.expm1(x / desc.alpha)))
activation("ThresholdedRelu")(lambda desc, x: np.where(x > desc.alpha, x, 0))
activation("Sigmoid")(lambda desc, x: sigmoid(x))
activation("HardSigmoid")(lambda desc, x: np.clip(desc.alpha * x + desc.beta, 0, 1))
activation("HardSwish")(lambda desc, x: x * np.clip(x * (1 / 6) + 0.5, 0, 1))
activation("Tanh")(lambda desc, x: np.tanh(x))
activation("Softplus")(lambda desc, x: softplus(x))
activation("Softsign")(lambda desc, x: x / (1 + np.abs(x)))
activation("Mish")(lambda desc, x: x * np.tanh(softplus(x)))


@activation("Gelu")
def gelu(desc, x):
    if desc.approximate == "tanh":
        return 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x**3)))
    return 0.5 * x * (1 + erf(x / np.sqrt(2)))


@activation("PRelu")
def prelu(desc, x, slope):
    slope = slope.reshape(prelu_slope_shape(x.shape, slope.shape, desc.opset))
    return np.where(x > 0, x, x * slope)


def _scalar_bound(value: np.ndarray | None, dtype: np.dtype) -> np.ndarray | None:
    return None if value is None else np.asarray(value, dtype=dtype).reshape(())


@activation("Clip")
def clip(desc, x, low=None, high=None):
    if desc.opset < 11:
        low, high = desc.min, desc.max
    low, high = _scalar_bound(low, x.dtype), _scalar_bound(high, x.dtype)
    # max before min: when low > high every value becomes high, as ONNX says.
    if low is not None:
        x = np.maximum(x, low)
    if high is not None:
        x = np.minimum(x, high)
    return x
