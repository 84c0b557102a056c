"""QuantizeLinear, DequantizeLinear and DynamicQuantizeLinear kernels.

Integer outputs round half to even and clamp to the type's range; float8, float6 and float4
outputs are ``x / scale + zero_point`` converted as Cast converts (``saturate`` included)."""

from __future__ import annotations

import ml_dtypes
import numpy as np

from flowrt.engine.graph.layers.quantize import (
    QUANTIZED_FLOAT_TYPES,
    QuantizeLinearDescriptor,
    dequantized_type,
    precision_type,
    quantized_type,
)
from flowrt.types import DataType
from flowrt.workers.cpu.ref.kernels import ref_kernel
from flowrt.workers.cpu.ref.kernels.cast import convert, widened


def expand_param(param: np.ndarray, shape: tuple[int, ...], axis: int, block_size: int) -> np.ndarray:
    """A scale or zero point made to broadcast against an input of ``shape``: a single value
    as is, a per-axis vector along ``axis``, per-block values repeated over their blocks."""
    if param.size == 1 and param.ndim <= 1:
        return param.reshape(())
    axis %= len(shape)
    if not block_size:
        return param.reshape([-1 if i == axis else 1 for i in range(len(shape))])
    return np.repeat(param, block_size, axis=axis)[(slice(None),) * axis + (slice(0, shape[axis]),)]


def _scaled(desc, x: np.ndarray, scale: np.ndarray) -> np.ndarray:
    """``x / scale`` in ``precision`` when set, else in numpy's type of the two; a float8e8m0
    scale (a power of two, held exactly by float32) is float32 there."""
    precision = precision_type(desc)
    if precision is not None:
        x, scale = widened(x).astype(precision.numpy), widened(scale).astype(precision.numpy)
    elif scale.dtype == DataType.FLOAT8E8M0.numpy:
        scale = scale.astype(np.float32)
    return x / scale


@ref_kernel("QuantizeLinear")
def quantize_linear(desc, x, scale, zero_point=None):
    target = quantized_type(desc, None if zero_point is None else DataType.from_numpy(zero_point.dtype))
    scale = expand_param(scale, x.shape, desc.axis, desc.block_size)
    if zero_point is not None:
        zero_point = expand_param(widened(zero_point), x.shape, desc.axis, desc.block_size)
    with np.errstate(all="ignore"):  # 0 scales and NaNs saturate as the cast makes them
        scaled = _scaled(desc, x, scale)
        if target in QUANTIZED_FLOAT_TYPES:
            # The zero point (float32, exact) adds in at least float32; the cast then rounds once.
            y = scaled if zero_point is None else widened(scaled) + zero_point
            return convert(y, target, saturate=bool(desc.saturate))
        # float64 holds every rounded value and zero point exactly (float16 would not).
        q = np.rint(widened(scaled)).astype(np.float64)
        if zero_point is not None:
            q += zero_point
        info = ml_dtypes.iinfo(target.numpy)
        return np.clip(q, info.min, info.max).astype(target.numpy)


@ref_kernel("DequantizeLinear")
def dequantize_linear(desc, x, scale, zero_point=None):
    target = dequantized_type(desc, DataType.from_numpy(scale.dtype))
    # float32 holds the 16-, 8-, 4- and 2-bit integers and every float8, float6 and float4 value
    # exactly; int32 needs float64.
    compute = np.float64 if x.dtype == np.int32 else np.float32
    shifted = x.astype(compute)
    if zero_point is not None:
        shifted -= expand_param(zero_point, x.shape, desc.axis, desc.block_size).astype(compute)
    scale = widened(expand_param(scale, x.shape, desc.axis, desc.block_size))
    return (shifted * scale).astype(target.numpy)


@ref_kernel("DynamicQuantizeLinear")
def dynamic_quantize_linear(desc, x):
    # The range always includes 0 so that 0 is exactly representable, as ONNX specifies.
    high = np.float32(max(0.0, float(np.max(x)))) if x.size else np.float32(0)
    low = np.float32(min(0.0, float(np.min(x)))) if x.size else np.float32(0)
    scale = np.float32(1.0 if high == low else high - low) / np.float32(255)
    with np.errstate(all="ignore"):
        initial = np.float32(0) - low / scale
        # A range of subnormals makes the scale 0 and this NaN, which min(255, .) takes to 255
        # in onnx's reference and in ONNX Runtime (std::min): so here.
        zero_point = np.float32(255) if np.isnan(initial) else np.rint(np.clip(initial, 0, 255))
        y = np.clip(np.rint(x / scale) + zero_point, 0, 255)
    return y.astype(np.uint8), np.array(scale, dtype=np.float32), np.array(zero_point, dtype=np.uint8)


_PER_TENSOR = QuantizeLinearDescriptor()


def _qlinear_binary(op, a, a_scale, a_zero, b, b_scale, b_zero, c_scale, c_zero=None):
    """The DequantizeLinear -> op -> QuantizeLinear group QLinearAdd and QLinearMul stand for,
    each step as its own kernel computes it (a float32 B: as it is). An absent zero point is
    0 of its tensor's type (C's: of A's type)."""
    a_zero = np.zeros((), a.dtype) if a_zero is None else a_zero
    b_zero = np.zeros((), b.dtype) if b_zero is None else b_zero
    c_zero = np.zeros((), a.dtype) if c_zero is None else c_zero
    da = dequantize_linear(_PER_TENSOR, a, a_scale, a_zero)
    db = b if b.dtype == np.float32 else dequantize_linear(_PER_TENSOR, b, b_scale, b_zero)
    return quantize_linear(_PER_TENSOR, op(da, db), c_scale, c_zero)


@ref_kernel("QLinearAdd")
def qlinear_add(desc, *inputs):
    return _qlinear_binary(np.add, *inputs)


@ref_kernel("QLinearMul")
def qlinear_mul(desc, *inputs):
    return _qlinear_binary(np.multiply, *inputs)
