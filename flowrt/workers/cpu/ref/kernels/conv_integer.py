"""ConvInteger and QLinearConv kernels: Conv's im2col and matmul in float64, which is exact
here (products of 8-bit values summed over fewer than 2**37 terms stay within a 53-bit
mantissa), then QLinearConv's requantization as ONNX Runtime and onnx's reference do it."""

from __future__ import annotations

import numpy as np

from flowrt.workers.cpu.ref.kernels import ref_kernel
from flowrt.workers.cpu.ref.kernels.conv import conv


def _per_channel(value: np.ndarray, rank: int, axis: int) -> np.ndarray:
    """``value`` (one element, or one per channel along ``axis``) shaped to broadcast against a
    tensor of ``rank`` dims."""
    if value.size == 1:
        return value.reshape(())
    return value.reshape([-1 if i == axis else 1 for i in range(rank)])


def _integer_conv(desc, x, x_zero_point, w, w_zero_point) -> np.ndarray:
    """conv(x - x_zero_point, w - w_zero_point), exact, as float64."""
    x64 = x.astype(np.float64)
    if x_zero_point is not None:
        x64 -= x_zero_point.astype(np.float64).reshape(())
    w64 = w.astype(np.float64)
    if w_zero_point is not None:
        w64 -= _per_channel(w_zero_point.astype(np.float64), w.ndim, 0)
    return conv(desc, x64, w64)


@ref_kernel("ConvInteger")
def conv_integer(desc, x, w, x_zero_point=None, w_zero_point=None):
    return _integer_conv(desc, x, x_zero_point, w, w_zero_point).astype(np.int32)


@ref_kernel("QLinearConv")
def qlinear_conv(desc, x, x_scale, x_zero_point, w, w_scale, w_zero_point, y_scale, y_zero_point, b=None):
    total = _integer_conv(desc, x, x_zero_point, w, w_zero_point)
    if b is not None:
        total += _per_channel(b.astype(np.float64), total.ndim, 1)
    # The combined scale in the scales' own precision (float32), as ONNX Runtime folds it.
    scale = x_scale.reshape(()) * _per_channel(w_scale, total.ndim, 1) / y_scale.reshape(())
    y = np.rint(total * scale) + y_zero_point.reshape(())
    limits = np.iinfo(y_zero_point.dtype)
    return np.clip(y, limits.min, limits.max).astype(y_zero_point.dtype)
