"""NonMaxSuppression and RoiAlign kernels.

Both compute in the float type and in the order of onnx's reference implementation (boxes:
their own type; regions: theirs, at least float32, as the float32 spatial_scale makes it
there), so that the comparisons deciding which box survives (IoU > threshold) and where a
sampling point falls (on or off the map, a ceil) come out on the same side as there.
"""

from __future__ import annotations

import numpy as np

from flowrt.engine.graph.layers.detection import check_iou_threshold
from flowrt.errors import ShapeError
from flowrt.workers.cpu.ref.kernels import ref_kernel


def _first_value(value: np.ndarray | None, default):
    """The single value of an optional scalar input; ``default`` when absent or empty."""
    if value is None or value.size == 0:
        return default
    if value.size > 1:
        raise ShapeError(f"NonMaxSuppression: a scalar threshold or count expected, got shape {value.shape}")
    return value.reshape(-1)[0]


def _box_extents(boxes: np.ndarray, center_point_box: int) -> tuple[np.ndarray, ...]:
    """(y_min, x_min, y_max, x_max) of each box, each of shape [..., boxes]."""
    if center_point_box:
        x, y = boxes[..., 0], boxes[..., 1]
        half_w, half_h = boxes[..., 2] / 2, boxes[..., 3] / 2
        return y - half_h, x - half_w, y + half_h, x + half_w
    y1, x1, y2, x2 = (boxes[..., i] for i in range(4))
    return np.minimum(y1, y2), np.minimum(x1, x2), np.maximum(y1, y2), np.maximum(x1, x2)


def _overlaps(extents, areas, kept: int, others: np.ndarray, threshold) -> np.ndarray:
    """Whether each box of ``others`` overlaps box ``kept`` by an IoU above ``threshold``;
    never for boxes without a positive intersection, area or union."""
    y0, x0, y1, x1 = extents
    inter_x0, inter_x1 = np.maximum(x0[others], x0[kept]), np.minimum(x1[others], x1[kept])
    inter_y0, inter_y1 = np.maximum(y0[others], y0[kept]), np.minimum(y1[others], y1[kept])
    intersection = (inter_x1 - inter_x0) * (inter_y1 - inter_y0)
    union = areas[others] + areas[kept] - intersection
    valid = (inter_x1 > inter_x0) & (inter_y1 > inter_y0) & (intersection > 0)
    valid &= (areas[others] > 0) & (areas[kept] > 0) & (union > 0)
    with np.errstate(divide="ignore", invalid="ignore"):
        return valid & (intersection / union > threshold)


def _select(extents, areas, scores, max_boxes: int, iou_threshold, score_threshold) -> list[int]:
    """Greedy suppression among one class's boxes: the indices kept, highest score first
    (equal scores: lowest index first)."""
    candidates = (
        np.arange(scores.size) if score_threshold is None else np.flatnonzero(scores > score_threshold)
    )
    order = candidates[np.argsort(-scores[candidates], kind="stable")]
    kept: list[int] = []
    # Suppressing by each kept box in turn is the reference's check of each candidate
    # against every box kept before it: IoU is symmetric, bit for bit.
    while order.size and len(kept) < max_boxes:
        top, order = int(order[0]), order[1:]
        kept.append(top)
        order = order[~_overlaps(extents, areas, top, order, iou_threshold)]
    return kept


@ref_kernel("NonMaxSuppression")
def non_max_suppression(desc, boxes, scores, max_output=None, iou_threshold=None, score_threshold=None):
    check_iou_threshold(iou_threshold)
    max_boxes = max(int(_first_value(max_output, 0)), 0)
    iou = _first_value(iou_threshold, boxes.dtype.type(0))
    score_min = _first_value(score_threshold, None)
    rows = []  # (batch, class, box) of each kept box
    if max_boxes > 0:
        for batch in range(boxes.shape[0]):
            extents = _box_extents(boxes[batch], desc.center_point_box)
            y0, x0, y1, x1 = extents
            areas = (x1 - x0) * (y1 - y0)
            for cls in range(scores.shape[1]):
                kept = _select(extents, areas, scores[batch, cls], max_boxes, iou, score_min)
                rows.extend((batch, cls, box) for box in kept)
    return np.array(rows, dtype=np.int64).reshape(len(rows), 3)


def _sample_axis(start, bin_size, bins: int, grid: int, limit: int):
    """Bilinear sampling along one axis of one region: for each of ``bins * grid`` points,
    the lower and upper pixel and their weights (zero for a point off the map)."""
    dtype = np.asarray(start).dtype
    bin_index = np.arange(bins).astype(dtype).repeat(grid)
    step = np.tile(np.arange(grid) + 0.5, bins).astype(dtype)
    pos = start + bin_index * bin_size + step * bin_size / grid
    off_map = (pos < -1.0) | (pos > limit)
    pos = np.maximum(pos, 0).astype(dtype)
    low = pos.astype(np.int64)
    at_edge = low >= limit - 1
    low = np.where(at_edge, limit - 1, low)
    high = np.where(at_edge, limit - 1, low + 1)
    pos = np.where(at_edge, low.astype(dtype), pos)
    frac = (pos - low).astype(dtype)
    upper_w, lower_w = frac, (1.0 - frac).astype(dtype)
    lower_w[off_map], upper_w[off_map] = 0, 0
    low[off_map], high[off_map] = 0, 0
    return low, high, lower_w, upper_w


def _grid(extent, bins: int, sampling_ratio: int) -> int:
    """Sampling points per bin side: the fixed ratio, or as many as the bin is wide."""
    if not np.isfinite(extent):
        raise ShapeError(f"RoiAlign: regions of finite coordinates expected, got one {extent} wide")
    return sampling_ratio if sampling_ratio > 0 else int(np.ceil(extent / bins))


def _align_one(desc, fmap: np.ndarray, roi: np.ndarray) -> np.ndarray:
    """RoiAlign of one region over one image's feature map [C, H, W]: [C, out_h, out_w]."""
    out_h, out_w = desc.output_height, desc.output_width
    offset = 0.5 if desc.half_pixel else 0.0
    scale = np.float32(desc.spatial_scale)  # an ONNX float attribute: float32
    x0, y0, x1, y1 = (roi[i] * scale - offset for i in range(4))
    width, height = x1 - x0, y1 - y0
    if not desc.half_pixel:  # output_half_pixel makes malformed regions 1x1
        width, height = max(width, 1.0), max(height, 1.0)
    grid_h, grid_w = _grid(height, out_h, desc.sampling_ratio), _grid(width, out_w, desc.sampling_ratio)
    channels, rows, cols = fmap.shape
    if grid_h <= 0 or grid_w <= 0:  # an inverted region samples nothing
        return np.zeros((channels, out_h, out_w), fmap.dtype)
    y_lo, y_hi, wy_lo, wy_hi = _sample_axis(y0, height / out_h, out_h, grid_h, rows)
    x_lo, x_hi, wx_lo, wx_hi = _sample_axis(x0, width / out_w, out_w, grid_w, cols)
    corners = [
        np.outer(wy_lo, wx_lo) * fmap[:, y_lo][:, :, x_lo],
        np.outer(wy_lo, wx_hi) * fmap[:, y_lo][:, :, x_hi],
        np.outer(wy_hi, wx_lo) * fmap[:, y_hi][:, :, x_lo],
        np.outer(wy_hi, wx_hi) * fmap[:, y_hi][:, :, x_hi],
    ]
    if desc.mode == "avg":
        samples = corners[0] + corners[1] + corners[2] + corners[3]
        pooled = samples.reshape(channels, out_h, grid_h, out_w, grid_w).sum(axis=(2, 4))
        return pooled / (grid_h * grid_w)
    # "max" takes the largest weighted corner, not the largest sample, as onnx's reference
    # and ONNX Runtime do.
    samples = np.maximum.reduce(corners)
    return samples.reshape(channels, out_h, grid_h, out_w, grid_w).max(axis=(2, 4))


@ref_kernel("RoiAlign")
def roi_align(desc, x, rois, batch_indices):
    batches = x.shape[0]
    if np.any(batch_indices < 0) or np.any(batch_indices >= batches):
        raise ShapeError(
            f"RoiAlign: batch_indices must be in [0, {batches}) (X's batch size), got {batch_indices.tolist()}"
        )
    if rois.shape[0] != batch_indices.shape[0]:
        raise ShapeError(
            f"RoiAlign: one batch index per region expected, got {rois.shape} and {batch_indices.shape}"
        )
    out = np.empty((rois.shape[0], x.shape[1], desc.output_height, desc.output_width), x.dtype)
    for n, (roi, batch) in enumerate(zip(rois, batch_indices)):
        out[n] = _align_one(desc, x[batch], roi)
    return out
