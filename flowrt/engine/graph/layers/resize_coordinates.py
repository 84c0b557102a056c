"""Where each output position of a Resize reads its input, along one axis: the coordinate
mapping, nearest rounding and interpolation taps that every backend's resize shares (CpuRef
sums the taps with numpy, CpuAcc and GpuAcc gather them from tables), so that each mode means
the same on every backend. Registers no layer kind.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from flowrt.engine.graph.layers.resize import ResizeDescriptor


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
    rounding: dict[str, Callable[[np.ndarray], np.ndarray]] = {
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
