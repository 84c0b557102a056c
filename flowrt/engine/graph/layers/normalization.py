"""Normalization layers: BatchNormalization, InstanceNormalization, LayerNormalization,
RMSNormalization, GroupNormalization, MeanVarianceNormalization and LRN.

Each output Y has the shape and dtype of its input X. Per-channel parameters (scale, bias,
mean, var) run along dim 1 of X, ``C``.
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs

from flowrt.engine.graph.layer_kind import as_tuple, layer_kind
from flowrt.engine.graph.layers.elementwise import FLOAT_TYPES, expect_dtype
from flowrt.engine.graph.shapes import normalize_axis
from flowrt.errors import ShapeError
from flowrt.types import DataType, Dim, TensorInfo

LATEST_OPSET = 21
_FLAG = attrs.validators.in_((0, 1))
_POSITIVE = attrs.validators.gt(0)


def _consumed_inputs():
    """The opset 1 ``consumed_inputs`` hint, accepted and ignored."""
    return attrs.field(default=None, converter=as_tuple)


def check_data(info: TensorInfo, where: str, min_rank: int = 2) -> None:
    """X must be a float tensor of at least ``min_rank`` dims (when its rank is known)."""
    expect_dtype(info, FLOAT_TYPES, where)
    if info.shape is not None and len(info.shape) < min_rank:
        raise ShapeError(
            f"{where}: input of rank {min_rank} or more expected, got shape {info.format_shape()}"
        )


def check_param(info: TensorInfo | None, size: Dim, what: str, where: str) -> None:
    """A parameter must be a float 1-D tensor of ``size`` (when both are known)."""
    if info is None:
        return
    expect_dtype(info, FLOAT_TYPES, f"{where} {what}")
    if info.shape is None:
        return
    if len(info.shape) != 1 or (
        isinstance(size, int) and isinstance(info.shape[0], int) and info.shape[0] != size
    ):
        expected = f"({size},)" if isinstance(size, int) else "a 1-D tensor"
        raise ShapeError(f"{where}: {what} of shape {expected} expected, got {info.format_shape()}")


def _channels(x: TensorInfo) -> Dim:
    return None if x.shape is None else x.shape[1]


@attrs.frozen
class BatchNormalizationDescriptor:
    """BatchNormalization with the attributes of every opset.

    It normalizes with the given mean and var (inference) unless it is asked to train: by
    ``training_mode`` from opset 14, by asking for the extra outputs before that (unless
    ``is_test``, opset <= 6). Training uses the batch's statistics and returns the updated
    running mean and var. ``spatial`` = 0 (before opset 9) gives per-activation parameters
    of shape (C, D1, ..., Dn).
    """

    epsilon: float = 1e-5
    momentum: float = 0.9
    training_mode: int = attrs.field(default=0, validator=_FLAG)
    spatial: int = attrs.field(default=1, validator=_FLAG)
    is_test: int = attrs.field(default=0, validator=_FLAG)
    consumed_inputs: tuple[int, ...] | None = _consumed_inputs()
    opset: int = LATEST_OPSET
    num_outputs: int = attrs.field(default=1, validator=attrs.validators.in_((1, 2, 3, 4, 5)))

    @property
    def training(self) -> bool:
        """Whether the batch's own statistics are used."""
        if self.opset >= 14:
            return bool(self.training_mode)
        return self.num_outputs > 1 and not self.is_test


@layer_kind("BatchNormalization", BatchNormalizationDescriptor, min_inputs=5, max_inputs=5, num_outputs=None)
def infer_batch_normalization(desc: BatchNormalizationDescriptor, inputs, consts):
    x = inputs[0]
    check_data(x, "BatchNormalization")
    names = ("scale", "B", "mean", "var")
    if desc.spatial:
        for info, what in zip(inputs[1:], names, strict=True):
            check_param(info, _channels(x), what, "BatchNormalization")
    else:
        for info, what in zip(inputs[1:], names, strict=True):
            expect_dtype(info, FLOAT_TYPES, f"BatchNormalization {what}")
    # Running mean and var, then (before opset 14) the batch's mean and var: all like the inputs.
    return [x, inputs[3], inputs[4], inputs[3], inputs[4]][: desc.num_outputs]


@attrs.frozen
class InstanceNormalizationDescriptor:
    """InstanceNormalization: each (sample, channel) plane normalized on its own."""

    epsilon: float = 1e-5
    consumed_inputs: tuple[int, ...] | None = _consumed_inputs()


@layer_kind("InstanceNormalization", InstanceNormalizationDescriptor, min_inputs=3, max_inputs=3)
def infer_instance_normalization(desc: InstanceNormalizationDescriptor, inputs, consts):
    x = inputs[0]
    check_data(x, "InstanceNormalization")
    check_param(inputs[1], _channels(x), "scale", "InstanceNormalization")
    check_param(inputs[2], _channels(x), "B", "InstanceNormalization")
    return [x]


def _stash_type(instance: object, attribute: attrs.Attribute, value: int) -> None:
    # 1 is float32, the only stash type with a numpy dtype (the other ONNX allows is bfloat16).
    if value != 1:
        raise ValueError(f"stash_type 1 (float32) expected, got {value}")


@attrs.frozen
class LayerNormalizationDescriptor:
    """LayerNormalization over the dims from ``axis`` on; optional Mean and InvStdDev outputs
    (float32, shaped like X with the normalized dims set to 1). The first stage runs in at
    least float32 (``stash_type`` 1)."""

    axis: int = -1
    epsilon: float = 1e-5
    stash_type: int = attrs.field(default=1, validator=_stash_type)
    num_outputs: int = attrs.field(default=1, validator=attrs.validators.in_((1, 2, 3)))


@layer_kind("LayerNormalization", LayerNormalizationDescriptor, min_inputs=2, max_inputs=3, num_outputs=None)
def infer_layer_normalization(desc: LayerNormalizationDescriptor, inputs, consts):
    x = inputs[0]
    check_data(x, "LayerNormalization", min_rank=1)
    for info in inputs[1:]:
        if info is not None:
            expect_dtype(info, FLOAT_TYPES, "LayerNormalization scale and bias")
            check_unidirectional(x.shape, info.shape, "LayerNormalization")
    if x.shape is None:
        stat_shape = None
    else:
        axis = normalize_axis(desc.axis, len(x.shape), "LayerNormalization")
        stat_shape = x.shape[:axis] + (1,) * (len(x.shape) - axis)
    stat = TensorInfo(stat_shape, DataType.FLOAT32)
    return [x, stat, stat][: desc.num_outputs]


def check_unidirectional(x_shape: Sequence[Dim] | None, p_shape: Sequence[Dim] | None, where: str) -> None:
    """ShapeError unless a parameter of ``p_shape`` broadcasts to ``x_shape`` (one way)."""
    if x_shape is None or p_shape is None:
        return
    fits = len(p_shape) <= len(x_shape) and all(
        p == 1 or p == d or not isinstance(p, int) or not isinstance(d, int)
        for p, d in zip(reversed(p_shape), reversed(x_shape), strict=False)
    )
    if not fits:
        raise ShapeError(
            f"{where}: parameter of shape {tuple(p_shape)} does not broadcast to the input {tuple(x_shape)}"
        )


@attrs.frozen
class GroupNormalizationDescriptor:
    """GroupNormalization: channels split into ``num_groups`` groups normalized per sample.
    ``scale`` and ``bias`` are per channel from opset 21, per group in opset 18."""

    num_groups: int = attrs.field(validator=_POSITIVE)
    epsilon: float = 1e-5
    stash_type: int = attrs.field(default=1, validator=_stash_type)
    opset: int = LATEST_OPSET

    def param_size(self, channels: Dim) -> Dim:
        """The length scale and bias must have for ``channels`` channels."""
        return channels if self.opset >= 21 else self.num_groups


@layer_kind("GroupNormalization", GroupNormalizationDescriptor, min_inputs=3, max_inputs=3)
def infer_group_normalization(desc: GroupNormalizationDescriptor, inputs, consts):
    x = inputs[0]
    check_data(x, "GroupNormalization")
    channels = _channels(x)
    if isinstance(channels, int) and channels % desc.num_groups:
        raise ShapeError(
            f"GroupNormalization: {channels} channels do not split into {desc.num_groups} groups"
        )
    check_param(inputs[1], desc.param_size(channels), "scale", "GroupNormalization")
    check_param(inputs[2], desc.param_size(channels), "bias", "GroupNormalization")
    return [x]


@attrs.frozen
class MeanVarianceNormalizationDescriptor:
    """MeanVarianceNormalization: (X - mean) / (std + 1e-9) over ``axes``."""

    axes: tuple[int, ...] = attrs.field(default=(0, 2, 3), converter=as_tuple)


@layer_kind("MeanVarianceNormalization", MeanVarianceNormalizationDescriptor)
def infer_mean_variance_normalization(desc: MeanVarianceNormalizationDescriptor, inputs, consts):
    x = inputs[0]
    check_data(x, "MeanVarianceNormalization", min_rank=0)
    if x.shape is not None:
        mvn_axes(desc, len(x.shape))
    return [x]


def mvn_axes(desc: MeanVarianceNormalizationDescriptor, rank: int) -> tuple[int, ...]:
    """The normalized, unique axes MeanVarianceNormalization reduces over."""
    axes = {normalize_axis(a, rank, "MeanVarianceNormalization") for a in desc.axes}
    if len(axes) != len(desc.axes):
        raise ShapeError(f"MeanVarianceNormalization: axes must be unique, got {list(desc.axes)}")
    return tuple(sorted(axes))


@attrs.frozen
class LRNDescriptor:
    """Local response normalization across ``size`` neighbouring channels."""

    size: int = attrs.field(validator=_POSITIVE)
    alpha: float = 1e-4
    beta: float = 0.75
    bias: float = 1.0


@layer_kind("LRN", LRNDescriptor)
def infer_lrn(desc: LRNDescriptor, inputs, consts):
    check_data(inputs[0], "LRN")
    return [inputs[0]]


@attrs.frozen
class RMSNormalizationDescriptor:
    """RMSNormalization (opset 23): ``X / sqrt(mean(X^2) + epsilon) * scale``, the mean taken
    over the dims from ``axis`` on, in at least float32 (``stash_type`` 1)."""

    axis: int = -1
    epsilon: float = 1e-5
    stash_type: int = attrs.field(default=1, validator=_stash_type)


@layer_kind("RMSNormalization", RMSNormalizationDescriptor, min_inputs=2, max_inputs=2)
def infer_rms_normalization(desc: RMSNormalizationDescriptor, inputs, consts):
    x, scale = inputs
    check_data(x, "RMSNormalization", min_rank=1)
    expect_dtype(scale, FLOAT_TYPES, "RMSNormalization scale")
    check_unidirectional(x.shape, scale.shape, "RMSNormalization")
    if x.shape is not None:
        normalize_axis(desc.axis, len(x.shape), "RMSNormalization")
    # Y takes the scale's type (ONNX's V), X's shape.
    return [TensorInfo(x.shape, scale.dtype)]
