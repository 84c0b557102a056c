"""NegativeLogLikelihoodLoss and SoftmaxCrossEntropyLoss: the loss of class scores against labels.

Both take data of shape (N, C, d1, ..., dk) (log-probabilities for the first, raw scores for
the second, which it turns into log-probabilities by LogSoftmax over C), integer labels of
shape (N, d1, ..., dk) and an optional per-class weight of shape (C,). A sample whose label
equals ``ignore_index`` has zero loss and zero weight; every other label must lie in [0, C).
``reduction`` ``none`` gives the per-sample loss, ``sum`` its sum and ``mean`` its sum divided
by the sum of the samples' weights (their count when there is no weight input), as PyTorch's
NLLLoss and the ONNX function bodies of both ops do.
"""

from __future__ import annotations

import attrs
import numpy as np

from flowrt.engine.graph.layer_kind import layer_kind
from flowrt.engine.graph.layers.elementwise import FLOAT_TYPES, expect_dtype, expect_same_dtype
from flowrt.engine.graph.layers.normalization import check_data, check_param
from flowrt.errors import ShapeError
from flowrt.types import DataType, Dim, TensorInfo

LOSS_REDUCTIONS = ("none", "sum", "mean")
_LABEL_TYPES = frozenset({DataType.INT32, DataType.INT64})


@attrs.frozen
class NegativeLogLikelihoodLossDescriptor:
    """NegativeLogLikelihoodLoss (opset 12 on): ``loss = -input[n, label, d...] * weight[label]``,
    reduced by ``reduction``; labels equal to ``ignore_index`` (None: no label is) count zero."""

    ignore_index: int | None = None
    reduction: str = attrs.field(default="mean", validator=attrs.validators.in_(LOSS_REDUCTIONS))


@attrs.frozen
class SoftmaxCrossEntropyLossDescriptor:
    """SoftmaxCrossEntropyLoss (opset 12 on): NegativeLogLikelihoodLoss of LogSoftmax(scores)
    over axis 1; with two outputs the second is that log-probability tensor."""

    ignore_index: int | None = None
    reduction: str = attrs.field(default="mean", validator=attrs.validators.in_(LOSS_REDUCTIONS))
    num_outputs: int = attrs.field(default=1, validator=attrs.validators.in_((1, 2)))


def _merged_dims(data: tuple[Dim, ...], labels: tuple[Dim, ...], op: str) -> tuple[Dim, ...]:
    """The label shape checked against (N, d1, ..., dk) of the data; known dims win."""
    expected = (data[0], *data[2:])
    if len(labels) != len(expected) or any(
        isinstance(a, int) and isinstance(b, int) and a != b for a, b in zip(labels, expected)
    ):
        shown = TensorInfo(tuple(d if isinstance(d, int) else None for d in expected)).format_shape()
        raise ShapeError(
            f"{op}: labels of shape {shown} (the data's (N, d1, ..., dk)) expected, "
            f"got {TensorInfo(labels).format_shape()} for data of shape {TensorInfo(data).format_shape()}"
        )
    return tuple(map(_known_first, labels, expected))


def _known_first(label_dim: Dim, data_dim: Dim) -> Dim:
    for d in (label_dim, data_dim):
        if isinstance(d, int):
            return d
    return label_dim if label_dim is not None else data_dim


def check_labels(labels: np.ndarray, classes: int, ignore_index: int | None, op: str) -> np.ndarray:
    """Where each label counts (is not ``ignore_index``); ShapeError naming the first label that
    counts but lies outside [0, ``classes``)."""
    counted = labels != ignore_index if ignore_index is not None else np.ones(labels.shape, dtype=bool)
    bad = counted & ((labels < 0) | (labels >= classes))
    if bad.any():
        position = tuple(int(i) for i in np.argwhere(bad)[0])
        allowed = f"[0, {classes})" + ("" if ignore_index is None else f" or ignore_index {ignore_index}")
        raise ShapeError(
            f"{op}: labels must be in {allowed}, got {int(labels[position])} at index {list(position)}"
        )
    return counted


def loss_output_infos(desc, inputs, consts, op: str) -> list[TensorInfo]:
    """The loss's info (and the data's, for a log-probability output): shape (N, d1, ..., dk)
    for reduction ``none``, a scalar otherwise, in the data's type."""
    data, labels = inputs[0], inputs[1]
    weight = inputs[2] if len(inputs) > 2 else None
    expect_dtype(data, FLOAT_TYPES, f"{op} input")
    check_data(data, op, min_rank=2)
    expect_dtype(labels, _LABEL_TYPES, f"{op} labels")
    classes = data.shape[1] if data.shape is not None else None
    if weight is not None:
        expect_same_dtype([data, weight], f"{op} input and weight")
        check_param(weight, classes, "weight", op)
    if labels.shape is not None and data.shape is not None:
        loss_shape: tuple[Dim, ...] | None = _merged_dims(data.shape, labels.shape, op)
    elif labels.shape is not None:
        loss_shape = labels.shape
    else:
        loss_shape = None if data.shape is None else (data.shape[0], *data.shape[2:])
    label_values = consts[1] if len(consts) > 1 else None
    if label_values is not None and isinstance(classes, int):
        check_labels(np.asarray(label_values), classes, desc.ignore_index, op)
    loss = TensorInfo(loss_shape if desc.reduction == "none" else (), data.dtype)
    return [loss, data]


@layer_kind("NegativeLogLikelihoodLoss", NegativeLogLikelihoodLossDescriptor, min_inputs=2, max_inputs=3)
def infer_negative_log_likelihood_loss(desc: NegativeLogLikelihoodLossDescriptor, inputs, consts):
    return loss_output_infos(desc, inputs, consts, "NegativeLogLikelihoodLoss")[:1]


@layer_kind(
    "SoftmaxCrossEntropyLoss", SoftmaxCrossEntropyLossDescriptor, min_inputs=2, max_inputs=3, num_outputs=None
)
def infer_softmax_cross_entropy_loss(desc: SoftmaxCrossEntropyLossDescriptor, inputs, consts):
    return loss_output_infos(desc, inputs, consts, "SoftmaxCrossEntropyLoss")[: desc.num_outputs]
