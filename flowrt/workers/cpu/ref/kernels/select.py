"""NonZero, Compress, Unique and ReverseSequence kernels."""

from __future__ import annotations

import numpy as np

from flowrt.engine.graph.layers.select import check_condition_length
from flowrt.errors import ShapeError
from flowrt.workers.cpu.ref.kernels import ref_kernel


@ref_kernel("NonZero")
def nonzero(desc, x):
    if x.ndim == 0:  # numpy refuses a scalar; ONNX gives no index rows
        return np.zeros((0, int(np.count_nonzero(x))), dtype=np.int64)
    return np.stack(np.nonzero(x)).astype(np.int64, copy=False)


@ref_kernel("Compress")
def compress(desc, x, condition):
    condition = condition.reshape(-1)
    data = x.reshape(-1) if desc.axis is None else x
    axis = 0 if desc.axis is None else desc.axis % x.ndim
    check_condition_length(condition.size, data.shape[axis])
    return np.compress(condition, data, axis=axis)


def _first_occurrence_order(values, first, inverse, counts, axis):
    """The outputs of a sorted unique reordered by where each value first occurs."""
    order = np.argsort(first, kind="stable")
    position = np.empty_like(order)
    position[order] = np.arange(order.size)
    return np.take(values, order, axis=axis), first[order], position[inverse], counts[order]


@ref_kernel("Unique")
def unique(desc, x):
    axis = None if desc.axis is None else desc.axis % x.ndim
    values, first, inverse, counts = np.unique(
        x, return_index=True, return_inverse=True, return_counts=True, axis=axis
    )
    inverse = inverse.reshape(-1)
    if not desc.sorted:
        values, first, inverse, counts = _first_occurrence_order(values, first, inverse, counts, axis or 0)
    return values, *(a.astype(np.int64, copy=False) for a in (first, inverse, counts))


@ref_kernel("ReverseSequence")
def reverse_sequence(desc, x, sequence_lens):
    steps = x.shape[desc.time_axis]
    lens = sequence_lens.astype(np.int64).reshape(1, -1)
    if np.any(lens < 0) or np.any(lens > steps):
        raise ShapeError(
            f"ReverseSequence: sequence_lens must be in [0, {steps}], got {lens.ravel().tolist()}"
        )
    # Source time index of each (time, batch) pair: mirrored inside the sequence, kept beyond.
    t = np.arange(steps).reshape(-1, 1)
    source = np.where(t < lens, lens - 1 - t, t)
    if desc.time_axis == 1:
        source = source.T
    source = source.reshape(source.shape + (1,) * (x.ndim - 2))
    return np.take_along_axis(x, source, axis=desc.time_axis)
