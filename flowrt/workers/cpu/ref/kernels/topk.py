"""TopK kernel."""

from __future__ import annotations

import numpy as np

from flowrt.engine.graph.layers.topk import topk_count
from flowrt.workers.cpu.ref.kernels import ref_kernel


def _descending_order(x: np.ndarray, axis: int) -> np.ndarray:
    """Indices that sort ``x`` descending along ``axis``, equal values lowest index first.

    A stable ascending sort of the reversed axis lists equal values highest original index
    first; reading it backwards gives descending values with equal ones lowest index first.
    Negating instead would break unsigned and minimum integers.
    """
    n = x.shape[axis]
    order = np.argsort(np.flip(x, axis), axis=axis, kind="stable")
    return (n - 1) - np.flip(order, axis)


@ref_kernel("TopK")
def topk(desc, x, k=None):
    axis = desc.axis % x.ndim
    count = topk_count(desc, k, x.shape[axis])
    if desc.largest:
        order = _descending_order(x, axis)
    else:
        order = np.argsort(x, axis=axis, kind="stable")
    indices = np.take(order, np.arange(count), axis=axis).astype(np.int64, copy=False)
    return np.take_along_axis(x, indices, axis=axis), indices
