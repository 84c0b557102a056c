"""NegativeLogLikelihoodLoss and SoftmaxCrossEntropyLoss kernels."""

from __future__ import annotations

import numpy as np

from flowrt.engine.graph.layers.loss import check_labels
from flowrt.engine.graph.layers.softmax import SoftmaxDescriptor
from flowrt.errors import ShapeError
from flowrt.workers.cpu.ref.kernels import ref_kernel
from flowrt.workers.cpu.ref.kernels.softmax import log_softmax

_CLASS_AXIS = SoftmaxDescriptor(axis=1)


def _negative_log_likelihood(desc, log_prob: np.ndarray, labels: np.ndarray, weight, op: str) -> np.ndarray:
    n, classes = log_prob.shape[:2]
    if labels.shape != (n, *log_prob.shape[2:]):
        raise ShapeError(
            f"{op}: labels of shape {(n, *log_prob.shape[2:])} (the data's (N, d1, ..., dk)) expected, "
            f"got {labels.shape}"
        )
    if weight is not None and weight.shape != (classes,):
        raise ShapeError(f"{op}: weight of shape ({classes},) expected, got {weight.shape}")
    samples = int(np.prod(log_prob.shape[2:], dtype=np.int64))
    labels = labels.astype(np.int64, copy=False)
    counted = check_labels(labels, classes, desc.ignore_index, op).reshape(n, samples)
    # Ignored labels read class 0 and are then zeroed: where(), not a product, so that an
    # infinite log-probability there cannot turn into NaN.
    safe = np.where(counted, labels.reshape(n, samples), 0)
    class_weight: np.ndarray | None
    if classes == 0:  # every label is ignored (check_labels saw to it): nothing to read
        picked = class_weight = np.zeros((n, samples), log_prob.dtype)
    else:
        picked = np.take_along_axis(log_prob.reshape(n, classes, samples), safe[:, None, :], axis=1)[:, 0, :]
        class_weight = None if weight is None else weight[safe]
    if class_weight is None:
        sample_weight = counted.astype(log_prob.dtype)
        loss = np.where(counted, -picked, 0)
    else:
        sample_weight = np.where(counted, class_weight, 0).astype(log_prob.dtype)
        loss = np.where(counted, -picked * class_weight, 0)
    if desc.reduction == "none":
        return loss.astype(log_prob.dtype, copy=False).reshape(labels.shape)
    return _reduced(loss, sample_weight, desc.reduction == "mean").astype(log_prob.dtype)


def _reduced(loss: np.ndarray, sample_weight: np.ndarray, mean: bool) -> np.ndarray:
    """The sum of the loss, or its sum over the sum of the samples' weights (``mean``).

    Both sums add up in float64 and round once, so float16 sums cannot overflow midway."""
    total = np.sum(loss, dtype=np.float64)
    if mean:
        with np.errstate(invalid="ignore", divide="ignore"):  # no counted sample: 0/0 is NaN
            total = total / np.sum(sample_weight, dtype=np.float64)
    return np.asarray(total)


@ref_kernel("NegativeLogLikelihoodLoss")
def negative_log_likelihood_loss(desc, log_prob, labels, weight=None):
    return _negative_log_likelihood(desc, log_prob, labels, weight, "NegativeLogLikelihoodLoss")


@ref_kernel("SoftmaxCrossEntropyLoss")
def softmax_cross_entropy_loss(desc, scores, labels, weight=None):
    log_prob = log_softmax(_CLASS_AXIS, scores)
    loss = _negative_log_likelihood(desc, log_prob, labels, weight, "SoftmaxCrossEntropyLoss")
    return (loss, log_prob) if desc.num_outputs == 2 else loss
