"""Normalization kernels: batch, instance, layer, group and mean-variance normalization, LRN.

Statistics are computed in at least float32 (float16 inputs are widened) and the result is
cast back to the input's dtype.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from flowrt.engine.graph.layers.normalization import mvn_axes
from flowrt.workers.cpu.ref.kernels import ref_kernel


def widened(x: np.ndarray) -> np.ndarray:
    """``x`` in a dtype of at least float32 precision."""
    return x.astype(np.promote_types(x.dtype, np.float32), copy=False)


def moments(x: np.ndarray, axes: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
    """Mean and (population) variance over ``axes``, kept as size-1 dims."""
    axes = tuple(axes)
    mean = np.mean(x, axis=axes, keepdims=True)
    centered = x - mean
    return mean, np.mean(centered * centered, axis=axes, keepdims=True)


def standardize(
    x: np.ndarray, axes: Sequence[int], epsilon: float
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(x - mean) / sqrt(var + epsilon) over ``axes``, with the mean and the 1 / sqrt(var + epsilon)."""
    mean, var = moments(x, axes)
    inv_std = 1.0 / np.sqrt(var + x.dtype.type(epsilon))
    return (x - mean) * inv_std, mean, inv_std


def per_channel(p: np.ndarray, rank: int) -> np.ndarray:
    """A (C,) parameter shaped to broadcast along dim 1 of a rank-``rank`` tensor."""
    return p.reshape((-1,) + (1,) * (rank - 2))


@ref_kernel("BatchNormalization")
def batch_normalization(desc, x, scale, bias, mean, var):
    xw = widened(x)
    # Per channel (spatial), or per activation: parameters of shape (C, D1, ..., Dn).
    param_shape = (-1,) + (1,) * (x.ndim - 2) if desc.spatial else x.shape[1:]
    s, b, m, v = (widened(p).reshape(param_shape) for p in (scale, bias, mean, var))
    if desc.training:
        batch_mean, batch_var = moments(xw, (0, *range(2, x.ndim)) if desc.spatial else (0,))
        batch_mean, batch_var = batch_mean[0], batch_var[0]
        running = (
            m * desc.momentum + batch_mean * (1 - desc.momentum),
            v * desc.momentum + batch_var * (1 - desc.momentum),
        )
        m, v = batch_mean, batch_var
    else:
        running = (m, v)
    # Fold the four parameters into one multiply-add per element.
    factor = s / np.sqrt(v + xw.dtype.type(desc.epsilon))
    y = (xw * factor + (b - m * factor)).astype(x.dtype, copy=False)
    stats = [
        t.reshape(ref.shape).astype(ref.dtype)
        for t, ref in zip((*running, m, v), (mean, var, mean, var), strict=True)
    ]
    return (y, *stats)[: desc.num_outputs]


@ref_kernel("InstanceNormalization")
def instance_normalization(desc, x, scale, bias):
    normalized, _, _ = standardize(widened(x), range(2, x.ndim), desc.epsilon)
    return (normalized * per_channel(scale, x.ndim) + per_channel(bias, x.ndim)).astype(x.dtype, copy=False)


@ref_kernel("LayerNormalization")
def layer_normalization(desc, x, scale, bias=None):
    axis = desc.axis % x.ndim
    normalized, mean, inv_std = standardize(widened(x), range(axis, x.ndim), desc.epsilon)
    # The second stage (scale and shift) runs in X's own type, as ONNX defines it.
    y = normalized.astype(x.dtype, copy=False) * scale
    if bias is not None:
        y = y + bias
    outputs = (y.astype(x.dtype, copy=False), mean.astype(np.float32), inv_std.astype(np.float32))
    return outputs[: desc.num_outputs]


@ref_kernel("GroupNormalization")
def group_normalization(desc, x, scale, bias):
    n, c = x.shape[:2]
    grouped = widened(x).reshape(n, desc.num_groups, -1)
    normalized, _, _ = standardize(grouped, (2,), desc.epsilon)
    normalized = normalized.astype(x.dtype, copy=False).reshape(x.shape)
    if desc.opset < 21:
        # Opset 18 gives one scale and bias per group: each applies to the group's channels.
        scale, bias = (np.repeat(p, c // desc.num_groups) for p in (scale, bias))
    return (normalized * per_channel(scale, x.ndim) + per_channel(bias, x.ndim)).astype(x.dtype, copy=False)


@ref_kernel("MeanVarianceNormalization")
def mean_variance_normalization(desc, x):
    xw = widened(x)
    mean, var = moments(xw, mvn_axes(desc, x.ndim))
    # ONNX adds 1e-9 to the standard deviation, not to the variance.
    return ((xw - mean) / (np.sqrt(var) + xw.dtype.type(1e-9))).astype(x.dtype, copy=False)


@ref_kernel("LRN")
def lrn(desc, x):
    xw = widened(x)
    channels = x.shape[1]
    # Channel c sums the squares of channels c - before .. c + after, clipped to the tensor.
    before, after = (desc.size - 1) // 2, desc.size // 2
    pad = [(0, 0)] * x.ndim
    pad[1] = (before, after)
    squares = np.pad(xw * xw, pad)
    square_sum = sum(squares[:, k : k + channels] for k in range(desc.size))
    scale = xw.dtype.type(desc.bias) + xw.dtype.type(desc.alpha / desc.size) * square_sum
    return (xw / scale ** xw.dtype.type(desc.beta)).astype(x.dtype, copy=False)
