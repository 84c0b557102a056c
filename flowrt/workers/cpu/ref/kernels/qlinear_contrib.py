"""CpuRef kernels of ONNX Runtime's com.microsoft quantized operators (see
``flowrt.engine.graph.layers.qlinear_contrib``), each computed as ONNX Runtime's CPU kernel
computes it, so that the 8-bit results are its own.

The definition is ``quantize(op(dequantize(X)))`` in float32, rounding half to even and
saturating; ONNX Runtime takes these steps, in these orders:

- QLinearSigmoid, QLinearLeakyRelu and QLinearConcat: a table of the 256 inputs, each
  dequantized (``X_scale * (x - zp)``), mapped and quantized as QuantizeLinear does. Sigmoid is
  MLAS's logistic (Eigen's rational polynomial, with the fused multiply-adds of its x86-64
  AVX2 kernel), not ``1 / (1 + exp(-x))``; ONNX Runtime builds without that kernel (ARM,
  SSE-only) round its last bits otherwise, which can move a value by one step.
- QLinearGlobalAveragePool (and QLinearAveragePool whose window is the whole unpadded image):
  an integer sum, less ``zp * cells``, times one float32 factor
  ``X_scale / (Y_scale * cells)``, rounded.
- QLinearAveragePool: the dequantized cells summed in float32 in row-major window order,
  divided by the count, then ``rint(mean / Y_scale + zp)`` (the zero point added before the
  rounding). With ``count_include_pad`` the count is the kernel's size, also for windows that
  ceil mode takes past the pads.
- QLinearSoftmax: ``exp`` from a float32 table of ``x - max(x)`` in X_scale's steps, scaled by
  a power that keeps a row's sum finite in float32, summed in order in float64; then
  ``rint(float32(e * floor(1 / Y_scale) / sum)) + zp``. X's zero point does not count (Softmax
  does not see a shift), and Y_scale counts only through ``floor(1 / Y_scale)``.

Checked against onnxruntime 1.32 on x86-64 (``tests/workers/cpu/ref/test_qlinear_contrib.py``):
equal, value for value.
"""

from __future__ import annotations

import math

import numpy as np

from flowrt.engine.graph.layers.pooling import pool_geometry
from flowrt.engine.graph.layers.qlinear_contrib import spatial_axes
from flowrt.engine.graph.layers.quantize import QuantizeLinearDescriptor
from flowrt.types import static_dims
from flowrt.workers.cpu.ref.kernels import ref_kernel
from flowrt.workers.cpu.ref.kernels.conv import pad_spatial, window_slices
from flowrt.workers.cpu.ref.kernels.quantize import dequantize_linear, quantize_linear

_PER_TENSOR = QuantizeLinearDescriptor()
F32 = np.float32


def _zero(zero_point: np.ndarray | None, dtype: np.dtype) -> np.ndarray:
    """A zero point as a 0-d array of ``dtype``: 0 when absent."""
    return np.zeros((), dtype) if zero_point is None else zero_point.reshape(()).astype(dtype)


def _scalar(param: np.ndarray) -> np.float32:
    return F32(param.reshape(-1)[0])


def _dequantized(x: np.ndarray, scale: np.ndarray, zero_point: np.ndarray | None) -> np.ndarray:
    """``X_scale * (x - zp)`` in float32 (the difference is exact there)."""
    return dequantize_linear(_PER_TENSOR, x, scale.reshape(()), _zero(zero_point, x.dtype))


def _quantized(
    y: np.ndarray, scale: np.ndarray, zero_point: np.ndarray | None, dtype: np.dtype
) -> np.ndarray:
    """QuantizeLinear's (MLAS's): ``saturate(rint(y / Y_scale) + zp)``."""
    return quantize_linear(_PER_TENSOR, y.astype(F32), scale.reshape(()), _zero(zero_point, dtype))


# MLAS's logistic constants (Eigen's): a rational polynomial on [-18, 18].
_ALPHA = tuple(map(F32, (4.37031012579801e-11, 1.15627324459942e-07, 6.08574864600143e-05,
                         8.51377133304701e-03, 2.48287947061529e-01)))  # fmt: skip
_BETA = tuple(map(F32, (6.10247389755681e-13, 5.76102136993427e-09, 6.29106785017040e-06,
                        1.70198817374094e-03, 1.16817656904453e-01, 9.93151921023180e-01)))  # fmt: skip


def _fused_multiply_add(a: np.ndarray, b: np.ndarray, c: np.float32) -> np.ndarray:
    """float32 ``a * b + c`` rounded once, as an FMA instruction: the product of two float32
    is exact in float64, so only the sum rounds (twice: float64, then float32, which differs
    from one rounding only where the float64 sum lands on a float32 tie; the tests never
    met one)."""
    return (a.astype(np.float64) * b + np.float64(c)).astype(F32)


def mlas_logistic(x: np.ndarray) -> np.ndarray:
    """The logistic function as MLAS's AVX2 kernel computes it in float32 (``p / q + 0.5``,
    clamped below at 0), which ONNX Runtime's QLinearSigmoid tables on x86-64."""
    v = np.clip(x.astype(F32), F32(-18), F32(18))
    v2 = v * v
    p = _fused_multiply_add(v2, np.full_like(v2, _ALPHA[0]), _ALPHA[1])
    for alpha in _ALPHA[2:]:
        p = _fused_multiply_add(p, v2, alpha)
    q = _fused_multiply_add(v2, np.full_like(v2, _BETA[0]), _BETA[1])
    for beta in _BETA[2:]:
        q = _fused_multiply_add(q, v2, beta)
    return np.maximum(p * v / q + F32(0.5), F32(0))


@ref_kernel("QLinearSigmoid")
def qlinear_sigmoid(desc, x, x_scale, x_zero=None, y_scale=None, y_zero=None):
    return _quantized(mlas_logistic(_dequantized(x, x_scale, x_zero)), y_scale, y_zero, x.dtype)


@ref_kernel("QLinearLeakyRelu")
def qlinear_leaky_relu(desc, x, x_scale, x_zero=None, y_scale=None, y_zero=None):
    v = _dequantized(x, x_scale, x_zero)
    return _quantized(np.where(v >= 0, v, F32(desc.alpha) * v), y_scale, y_zero, x.dtype)


@ref_kernel("QLinearConcat")
def qlinear_concat(desc, y_scale, y_zero, *triples):
    parts = [
        _quantized(_dequantized(x, scale, zero), y_scale, y_zero, y_zero.dtype)
        for x, scale, zero in zip(triples[::3], triples[1::3], triples[2::3], strict=True)
    ]
    return np.concatenate(parts, axis=desc.axis)


def _integer_average(x, x_scale, x_zero, y_scale, y_zero, axes: tuple[int, ...]) -> np.ndarray:
    """MLAS's global average: ``rint((sum - zp * cells) * (X_scale / (Y_scale * cells))) + zp``,
    the sum in integers, the product in float32."""
    cells = math.prod(x.shape[a] for a in axes)
    total = x.astype(np.int64).sum(axis=axes, keepdims=True) - int(_zero(x_zero, x.dtype)) * cells
    factor = _scalar(x_scale) / (_scalar(y_scale) * F32(cells))
    scaled = total.astype(np.int32).astype(F32) * factor
    info = np.iinfo(x.dtype)
    return np.clip(np.rint(scaled) + int(_zero(y_zero, x.dtype)), info.min, info.max).astype(x.dtype)


@ref_kernel("QLinearGlobalAveragePool")
def qlinear_global_average_pool(desc, x, x_scale, x_zero, y_scale, y_zero):
    axes = tuple(spatial_axes(x.ndim, desc.channels_last))
    return _integer_average(x, x_scale, x_zero, y_scale, y_zero, axes)


def _counts(desc, spatial, geometry) -> np.ndarray:
    """Each window's divisor: the kernel's size with ``count_include_pad``, else the input
    cells the window covers (at least 1: a window of padding only has no mean)."""
    if desc.count_include_pad:
        return np.array(math.prod(desc.kernel_shape))
    counts = np.ones((), dtype=np.int64)
    for size, k, s, begin, out in zip(spatial, desc.kernel_shape, geometry.strides, geometry.pads_begin,
                                      static_dims(geometry.out), strict=True):  # fmt: skip
        starts = np.arange(out) * s - begin
        per_axis = np.minimum(starts + k, size) - np.maximum(starts, 0)
        counts = np.multiply.outer(counts, per_axis)
    return np.maximum(counts, 1)


@ref_kernel("QLinearAveragePool")
def qlinear_average_pool(desc, x, x_scale, x_zero=None, y_scale=None, y_zero=None):
    if desc.channels_last:  # pooled as (N, C, spatial...), as ONNX Runtime's index arithmetic reads it
        x = np.moveaxis(x, -1, 1)
    geometry = pool_geometry(desc, x.shape[2:])
    if tuple(desc.kernel_shape) == x.shape[2:] and not any(geometry.pads_begin + geometry.pads_end):
        # ONNX Runtime runs a window of the whole unpadded image as QLinearGlobalAveragePool.
        y = _integer_average(x, x_scale, x_zero, y_scale, y_zero, tuple(range(2, x.ndim)))
    else:
        kernel = desc.kernel_shape
        padded = pad_spatial(_dequantized(x, x_scale, x_zero), geometry, kernel, 0)
        lead = (slice(None), slice(None))
        total = np.zeros((*x.shape[:2], *static_dims(geometry.out)), F32)
        for offset in np.ndindex(*kernel):  # in ONNX Runtime's order: the float32 sum rounds as its does
            total += padded[lead + window_slices(offset, geometry)]
        mean = total / _counts(desc, x.shape[2:], geometry).astype(F32)
        shifted = mean / _scalar(y_scale) + F32(_zero(y_zero, x.dtype))
        info = np.iinfo(x.dtype)
        y = np.clip(np.rint(shifted), info.min, info.max).astype(x.dtype)
    return np.moveaxis(y, 1, -1) if desc.channels_last else y


def _exp_table(x_scale: np.float32, row: int) -> np.ndarray:
    """ONNX Runtime's softmax table: entry ``k`` is ``exp((k - 255) * X_scale)`` times a power
    that keeps a sum of ``row`` entries finite in float32 (computed in float64, stored float32)."""
    headroom = math.log(float(np.finfo(F32).max / F32(row)))
    shift = max(0.0, headroom - 5) / float(x_scale)
    k = np.arange(256, dtype=np.float64)
    return np.exp((k - 255 + shift) * float(x_scale)).astype(F32)


def _softmax_rows(x: np.ndarray, x_scale, y_scale, y_zero) -> np.ndarray:
    """QLinearSoftmax over the last axis of ``x``."""
    table = _exp_table(_scalar(x_scale), x.shape[-1])
    wide = x.astype(np.int32)
    e = table[wide - wide.max(axis=-1, keepdims=True) + 255].astype(np.float64)
    total = np.cumsum(e, axis=-1)[..., -1:]  # in float64, in order, as ONNX Runtime sums
    steps = math.floor(F32(1) / _scalar(y_scale))
    with np.errstate(all="ignore"):
        q = np.rint((e * steps / total).astype(F32)) + int(_zero(y_zero, x.dtype))
    info = np.iinfo(x.dtype)
    return np.clip(np.nan_to_num(q, nan=info.min), info.min, info.max).astype(x.dtype)


@ref_kernel("QLinearSoftmax")
def qlinear_softmax(desc, x, x_scale, x_zero, y_scale, y_zero):
    if x.size == 0:
        return x.copy()
    axis = desc.resolved_axis(x.ndim, "QLinearSoftmax")
    if desc.coerces_to_2d:
        rows = x.reshape(math.prod(x.shape[:axis]), -1)
        return _softmax_rows(rows, x_scale, y_scale, y_zero).reshape(x.shape)
    moved = np.moveaxis(x, axis, -1)
    return np.moveaxis(_softmax_rows(moved, x_scale, y_scale, y_zero), -1, axis)
