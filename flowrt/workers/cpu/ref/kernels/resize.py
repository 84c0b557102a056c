"""Resize and Upsample kernels: separable, one axis at a time.

Every interpolation ONNX defines is separable, so an N-D resize is a 1-D resize along each
scaled axis in turn (as onnx's reference does). Along one axis, each output position reads a
few input positions (its taps) with weights; the kernel gathers the taps for all positions
at once and sums them, so the Python work is per axis, never per element.
"""

from __future__ import annotations

import math

import numpy as np

from flowrt.engine.graph.layers.resize import ResizeDescriptor, resize_inputs, resize_plan
from flowrt.workers.cpu.ref.kernels import ref_kernel


def source_coordinates(desc: ResizeDescriptor, out_len: int, in_len: int, scale: float, roi) -> np.ndarray:
    """Input coordinate (float64) of each output position along one axis."""
    y = np.arange(out_len, dtype=np.float64)
    mode = "asymmetric" if desc.legacy else desc.coordinate_transformation_mode
    # The mapping uses the real-valued output length scale * in_len, as the ONNX spec does.
    out_real = scale * in_len
    if mode == "asymmetric":
        return y / scale
    if mode == "half_pixel":
        return (y + 0.5) / scale - 0.5
    if mode == "pytorch_half_pixel":
        return np.full(out_len, -0.5) if out_real == 1 else (y + 0.5) / scale - 0.5
    if mode == "half_pixel_symmetric":
        offset = in_len / 2 * (1 - out_len / out_real)
        return offset + (y + 0.5) / scale - 0.5
    if mode == "align_corners":
        return np.zeros(out_len) if out_real == 1 else y * (in_len - 1) / (out_real - 1)
    # tf_crop_and_resize: positions spread over the region of interest.
    start, end = roi
    if out_real == 1:
        # The centre goes to float64 before the start is added, as in onnx's reference.
        centre = np.full(out_len, (end - start) * (in_len - 1) / 2, dtype=np.float64)
        return centre + start * (in_len - 1)
    return y * (end - start) * (in_len - 1) / (out_real - 1) + start * (in_len - 1)


def nearest_index(desc: ResizeDescriptor, x: np.ndarray, scale: float) -> np.ndarray:
    """The input position nearest mode picks for each coordinate (before clamping)."""
    if desc.legacy:
        # Opset 10 / Upsample: truncate when growing, round up when shrinking (onnxruntime's rule).
        return np.floor(x) if scale >= 1 else np.ceil(x)
    rounding = {
        "round_prefer_floor": lambda v: np.ceil(v - 0.5),
        "round_prefer_ceil": lambda v: np.floor(v + 0.5),
        "floor": np.floor,
        "ceil": np.ceil,
    }
    return rounding[desc.nearest_mode](x)


def _cubic(d: np.ndarray, a: float) -> np.ndarray:
    """Keys' cubic convolution kernel with coefficient ``a``."""
    d = np.abs(d)
    near = ((a + 2) * d - (a + 3)) * d * d + 1
    far = ((a * d - 5 * a) * d + 8 * a) * d - 4 * a
    return np.where(d <= 1, near, np.where(d < 2, far, 0.0))


def interpolation_taps(desc: ResizeDescriptor, x: np.ndarray, in_len: int, scale: float):
    """(indices, weights), both (out_len, taps): what linear or cubic reads for each coordinate.

    With antialias, a shrinking axis stretches the kernel by 1 / scale so that every input
    position contributes (as Pillow and onnx's reference do).
    """
    radius = 1 if desc.mode == "linear" else 2
    stretch = min(scale, 1.0) if desc.antialias else 1.0
    first = math.floor(-radius / stretch) + 1
    offsets = np.arange(first, 2 - first)
    base = np.floor(x)
    distance = (offsets[None, :] - (x - base)[:, None]) * stretch
    if desc.mode == "linear":
        weights = np.clip(1 - np.abs(distance), 0, 1)
    else:
        weights = _cubic(distance, desc.cubic_coeff_a)
    indices = base.astype(np.int64)[:, None] + offsets[None, :]
    if desc.exclude_outside:
        weights = np.where((indices < 0) | (indices >= in_len), 0.0, weights)
    if desc.antialias or desc.exclude_outside:
        total = weights.sum(axis=1, keepdims=True)
        weights = weights / np.where(total == 0, 1.0, total)
    return np.clip(indices, 0, in_len - 1), weights


def _along(values: np.ndarray, axis: int, ndim: int) -> np.ndarray:
    """A per-position array shaped to broadcast from ``axis`` on in an ndim-D tensor."""
    return values.reshape((1,) * axis + values.shape + (1,) * (ndim - axis - values.ndim))


def resize_axis(
    desc: ResizeDescriptor, data: np.ndarray, axis: int, out_len: int, scale: float, roi
) -> np.ndarray:
    """``data`` resized to ``out_len`` along ``axis``."""
    in_len = data.shape[axis]
    x = source_coordinates(desc, out_len, in_len, scale, roi)
    if desc.mode == "nearest":
        picked = np.clip(nearest_index(desc, x, scale), 0, in_len - 1).astype(np.intp)
        result = np.take(data, picked, axis=axis)
    else:
        indices, weights = interpolation_taps(desc, x, in_len, scale)
        weights = weights.astype(data.dtype)
        # One pass per tap (2 for linear, 4 for cubic): faster than summing a small tap axis.
        result = np.take(data, indices[:, 0], axis=axis) * _along(weights[:, 0], axis, data.ndim)
        for tap in range(1, indices.shape[1]):
            result += np.take(data, indices[:, tap], axis=axis) * _along(weights[:, tap], axis, data.ndim)
    if not desc.legacy and desc.coordinate_transformation_mode == "tf_crop_and_resize":
        outside = (x < 0) | (x > in_len - 1)
        if outside.any():
            result = np.where(_along(outside, axis, data.ndim), desc.extrapolation_value, result)
    return result


def _compute_dtype(dtype: np.dtype) -> np.dtype:
    return np.dtype(np.float32) if dtype in (np.float16, np.float32) else np.dtype(np.float64)


def resize_array(desc: ResizeDescriptor, data: np.ndarray, out_shape, scales, roi) -> np.ndarray:
    """``data`` resized to ``out_shape``; scales and roi (or None) are given for every dim."""
    result = data if desc.mode == "nearest" else data.astype(_compute_dtype(data.dtype), copy=False)
    rank = data.ndim
    for axis in range(rank):
        axis_roi = None if roi is None else (roi[axis], roi[axis + rank])
        whole = axis_roi is None or (math.isclose(axis_roi[0], 0.0) and math.isclose(axis_roi[1], 1.0))
        if math.isclose(scales[axis], 1.0) and out_shape[axis] == data.shape[axis] and whole:
            continue  # nothing moves along this axis
        result = resize_axis(desc, result, axis, int(out_shape[axis]), float(scales[axis]), axis_roi)
    if result.dtype == data.dtype:
        return result
    if data.dtype.kind in "iu":
        limits = np.iinfo(data.dtype)
        result = np.clip(np.round(result), limits.min, limits.max)
    return result.astype(data.dtype)


@ref_kernel("Resize")
def resize(desc, data, *args):
    roi, scales, sizes = resize_inputs(desc, args)
    out_shape, factors, full_roi = resize_plan(desc, data.shape, roi, scales, sizes)
    return resize_array(desc, data, out_shape, factors, full_roi)


@ref_kernel("Upsample")
def upsample(desc, data, scales=None):
    factors = desc.scale_values(scales)
    out_shape = [int(np.floor(d * f)) for d, f in zip(data.shape, factors, strict=True)]
    return resize_array(desc.as_resize(), data, out_shape, factors, None)
