"""Col2Im, CenterCropPad and MaxRoiPool kernels."""

from __future__ import annotations

import itertools
import math

import numpy as np

from flowrt.engine.graph.layers.image import center_crop_axes, col2im_blocks, col2im_dims
from flowrt.errors import ShapeError
from flowrt.types import TensorInfo
from flowrt.workers.cpu.ref.kernels import ref_kernel


def _block_targets(desc, image: list[int], block: list[int]) -> tuple[np.ndarray, np.ndarray]:
    """For each (block offset, block position) pair, in the input's column order: the flat
    image index it adds to, and whether it lands inside the image (not in the padding)."""
    rank = len(image)
    counts = col2im_blocks(desc, image, block)
    strides, pads, dilations = desc.geometry(rank)
    flat = np.zeros((math.prod(block), math.prod(counts)), np.int64)
    inside = np.ones(flat.shape, bool)
    offsets = np.array(list(itertools.product(*[range(b) for b in block]))).reshape(-1, rank)
    positions = np.array(list(itertools.product(*[range(c) for c in counts]))).reshape(-1, rank)
    for i in range(rank):
        pixel = positions[None, :, i] * strides[i] - pads[i] + offsets[:, None, i] * dilations[i]
        inside &= (pixel >= 0) & (pixel < image[i])
        flat = flat * image[i] + pixel
    return flat, inside


@ref_kernel("Col2Im")
def col2im(desc, data, image_shape, block_shape):
    image, block = [int(v) for v in image_shape], [int(v) for v in block_shape]
    dims = col2im_dims(desc, TensorInfo.of(data), image, block, len(image))
    assert dims is not None and all(isinstance(d, int) for d in dims)
    batch, channels = data.shape[0], dims[1]
    flat, inside = _block_targets(desc, image, block)
    columns = data.reshape(batch * channels, *flat.shape)
    out = np.zeros((batch * channels, math.prod(image)), data.dtype)
    np.add.at(out, (slice(None), flat[inside]), columns[:, inside])
    return out.reshape(dims)


def _centered(size: int, target: int) -> slice:
    """The centered window of ``min(size, target)`` within ``max(size, target)``: start at
    half the difference, rounded down."""
    start = abs(size - target) // 2
    return slice(start, start + min(size, target))


@ref_kernel("CenterCropPad")
def center_crop_pad(desc, data, shape):
    axes = center_crop_axes(desc, data.ndim)
    sizes = [int(v) for v in shape.reshape(-1)]
    if len(sizes) != len(axes) or min(sizes, default=0) < 0:
        raise ShapeError(
            f"CenterCropPad: {len(axes)} non-negative sizes (one per axis) expected, got {sizes}"
        )
    out_shape = list(data.shape)
    crop = [slice(None)] * data.ndim
    place = [slice(None)] * data.ndim
    for axis, target in zip(axes, sizes):
        size = data.shape[axis]
        out_shape[axis] = target
        window = _centered(size, target)
        if target < size:
            crop[axis] = window
        else:
            place[axis] = window
    fill = "" if data.dtype.kind in "OUS" else 0
    out = np.full(out_shape, fill, data.dtype)
    out[tuple(place)] = data[tuple(crop)]
    return out


def _bins(start: int, extent: int, bins: int, limit: int) -> list[tuple[int, int]]:
    """[begin, end) of each of ``bins`` bins over ``extent`` pixels from ``start``, clipped to
    [0, limit): floor and ceil of the float bin edges, as Caffe and ONNX Runtime compute them."""
    size = np.float32(extent) / np.float32(bins)
    edges = []
    for b in range(bins):
        begin = int(np.floor(np.float32(b) * size)) + start
        end = int(np.ceil(np.float32(b + 1) * size)) + start
        edges.append((min(max(begin, 0), limit), min(max(end, 0), limit)))
    return edges


def _round_half_away(value) -> int:
    """C's round(): halves away from zero."""
    return int(np.sign(value) * np.floor(np.abs(value) + 0.5))


@ref_kernel("MaxRoiPool")
def max_roi_pool(desc, x, rois):
    batches, channels, height, width = x.shape
    if rois.ndim != 2 or rois.shape[1] != 5:
        raise ShapeError(f"MaxRoiPool: rois [num_rois, 5] expected, got {rois.shape}")
    pooled_h, pooled_w = desc.pooled_shape
    out = np.zeros((rois.shape[0], channels, pooled_h, pooled_w), x.dtype)
    scale = np.float32(desc.spatial_scale)  # an ONNX float attribute: float32
    for n, roi in enumerate(rois):
        batch = int(roi[0])
        if not 0 <= batch < batches:
            raise ShapeError(f"MaxRoiPool: region {n}'s batch index must be in [0, {batches}), got {roi[0]}")
        x1, y1, x2, y2 = (_round_half_away(np.float32(v) * scale) for v in roi[1:])
        rows = _bins(y1, max(y2 - y1 + 1, 1), pooled_h, height)
        cols = _bins(x1, max(x2 - x1 + 1, 1), pooled_w, width)
        for (i, (r0, r1)), (j, (c0, c1)) in itertools.product(enumerate(rows), enumerate(cols)):
            if r1 > r0 and c1 > c0:  # an empty bin stays 0
                out[n, :, i, j] = x[batch, :, r0:r1, c0:c1].max(axis=(1, 2))
    return out
