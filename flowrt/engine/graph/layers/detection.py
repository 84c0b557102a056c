"""NonMaxSuppression and RoiAlign: the box operators of object detectors.

NonMaxSuppression's output, one row per kept box, has as many rows as the scores decide:
like NonZero's, its first dim is known only when the layer runs.
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs
import numpy as np

from flowrt.engine.graph.layer_kind import layer_kind
from flowrt.engine.graph.layers.elementwise import FLOAT_TYPES, expect_dtype
from flowrt.errors import DataTypeError, ShapeError
from flowrt.types import DataType, Dim, TensorInfo

F32 = frozenset({DataType.FLOAT32})
I64 = frozenset({DataType.INT64})


def expect_dims(info: TensorInfo, expected: Sequence[Dim], what: str, where: str) -> None:
    """ShapeError naming ``where`` and ``what`` unless ``info`` has ``expected``'s rank and its
    known dims; a None in ``expected`` (shown as ?) takes any dim, as does an unknown one."""
    if info.shape is None:
        return
    conflict = len(info.shape) != len(expected) or any(
        isinstance(d, int) and isinstance(e, int) and d != e for d, e in zip(info.shape, expected)
    )
    if conflict:
        shown = TensorInfo(tuple(expected)).format_shape()
        raise ShapeError(f"{where}: {what} of shape {shown} expected, got {info.format_shape()}")


def expect_one_value(info: TensorInfo | None, what: str, where: str) -> None:
    """ShapeError unless ``info`` (an optional scalar input) holds at most one value: a
    scalar or a 1-D tensor of one element (an empty one counts as absent, as in onnx's
    reference)."""
    if info is None or info.shape is None:
        return
    count = info.num_elements
    if len(info.shape) > 1 or (count is not None and count > 1):
        raise ShapeError(
            f"{where}: {what} must be a scalar or hold one value, got shape {info.format_shape()}"
        )


def check_iou_threshold(value: np.ndarray | None) -> None:
    """ShapeError when a known IoU threshold lies outside [0, 1], as ONNX Runtime refuses it."""
    if value is not None and value.size == 1:
        threshold = float(value.reshape(-1)[0])
        if not 0.0 <= threshold <= 1.0:
            raise ShapeError(f"NonMaxSuppression: iou_threshold must be in [0, 1], got {threshold}")


@attrs.frozen
class NonMaxSuppressionDescriptor:
    """NonMaxSuppression: per batch and class, the boxes kept by greedy suppression, highest
    score first. ``center_point_box`` 0: a box is [y1, x1, y2, x2] (any two opposite corners);
    1: [x_center, y_center, width, height]. The optional inputs: at most this many boxes per
    class (absent: 0, so none), the IoU above which a box is suppressed (absent: 0) and the
    score a box must exceed (absent: no filter)."""

    center_point_box: int = attrs.field(default=0, validator=attrs.validators.in_((0, 1)))


@layer_kind("NonMaxSuppression", NonMaxSuppressionDescriptor, min_inputs=2, max_inputs=5)
def infer_non_max_suppression(desc: NonMaxSuppressionDescriptor, inputs, consts):
    where = "NonMaxSuppression"
    boxes, scores = inputs[0], inputs[1]
    expect_dtype(boxes, F32, f"{where} input boxes")
    expect_dtype(scores, F32, f"{where} input scores")
    optional = list(inputs[2:]) + [None] * (5 - len(inputs))
    for info, name, types in zip(
        optional, ("max_output_boxes_per_class", "iou_threshold", "score_threshold"), (I64, F32, F32)
    ):
        if info is not None:
            expect_dtype(info, types, f"{where} input {name}")
            expect_one_value(info, name, where)
    check_iou_threshold(consts[3] if len(consts) > 3 else None)
    expect_dims(boxes, (None, None, 4), "boxes [num_batches, spatial_dimension, 4]", where)
    batches, count = (None, None) if boxes.shape is None else boxes.shape[:2]
    expect_dims(scores, (batches, None, count), "scores [num_batches, num_classes, spatial_dimension]", where)
    return [TensorInfo((None, 3), DataType.INT64)]


@attrs.frozen
class RoiAlignDescriptor:
    """RoiAlign: each region of interest (x1, y1, x2, y2, in the input's coordinates times
    ``spatial_scale``) cut into ``output_height`` x ``output_width`` bins, each the average
    (``mode`` avg) or maximum of bilinearly sampled points: ``sampling_ratio`` per bin side,
    or (0) as many as the bin is wide. ``coordinate_transformation_mode`` half_pixel shifts
    the region by -0.5 pixel; output_half_pixel does not, and makes every region at least
    1x1, as opset 10 always did (half_pixel is the default from opset 16)."""

    opset: int = 22
    coordinate_transformation_mode: str | None = attrs.field(
        default=None,
        validator=attrs.validators.optional(attrs.validators.in_(("half_pixel", "output_half_pixel"))),
    )
    mode: str = attrs.field(default="avg", validator=attrs.validators.in_(("avg", "max")))
    output_height: int = attrs.field(default=1, validator=attrs.validators.ge(1))
    output_width: int = attrs.field(default=1, validator=attrs.validators.ge(1))
    sampling_ratio: int = attrs.field(default=0, validator=attrs.validators.ge(0))
    spatial_scale: float = 1.0

    def __attrs_post_init__(self) -> None:
        if self.coordinate_transformation_mode is not None and self.opset < 16:
            raise ValueError(
                f"coordinate_transformation_mode exists from opset 16, this model is opset {self.opset}"
            )

    @property
    def half_pixel(self) -> bool:
        """Whether sampling points are shifted by half a pixel (the opset's default if unset)."""
        if self.coordinate_transformation_mode is None:
            return self.opset >= 16
        return self.coordinate_transformation_mode == "half_pixel"


@layer_kind("RoiAlign", RoiAlignDescriptor, min_inputs=3, max_inputs=3)
def infer_roi_align(desc: RoiAlignDescriptor, inputs, consts):
    where = "RoiAlign"
    x, rois, batch_indices = inputs
    expect_dtype(x, FLOAT_TYPES, f"{where} input X")
    if rois.dtype != x.dtype:
        raise DataTypeError(
            f"{where}: rois of X's type {x.dtype.name.lower()} expected, got {rois.dtype.name.lower()}"
        )
    expect_dtype(batch_indices, I64, f"{where} input batch_indices")
    expect_dims(x, (None, None, None, None), "X [N, C, H, W]", where)
    expect_dims(rois, (None, 4), "rois [num_rois, 4]", where)
    num_rois = None if rois.shape is None else rois.shape[0]
    expect_dims(batch_indices, (num_rois,), "batch_indices [num_rois]", where)
    if num_rois is None and batch_indices.shape is not None:
        num_rois = batch_indices.shape[0]
    channels = None if x.shape is None else x.shape[1]
    return [TensorInfo((num_rois, channels, desc.output_height, desc.output_width), x.dtype)]
