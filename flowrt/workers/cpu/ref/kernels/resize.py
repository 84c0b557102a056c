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
from flowrt.engine.graph.layers.resize_coordinates import (
    interpolation_taps,
    nearest_index,
    source_coordinates,
)
from flowrt.workers.cpu.ref.kernels import ref_kernel


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
