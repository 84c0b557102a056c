"""CumSum and CumProd kernels."""

from __future__ import annotations

import numpy as np

from flowrt.engine.graph.layers.cumulative import cumulative_axis
from flowrt.workers.cpu.ref.kernels import ref_kernel


def _cumulative(ufunc: np.ufunc, desc, x: np.ndarray, axis_value: np.ndarray) -> np.ndarray:
    """``ufunc.accumulate`` along the axis, honouring ``exclusive`` and ``reverse``."""
    axis = cumulative_axis(axis_value, x.ndim, "axis input")
    data = np.flip(x, axis) if desc.reverse else x
    if desc.exclusive and data.shape[axis] > 0:
        # Shift by one: the identity first, then the input without its last element.
        head = np.full_like(np.take(data, [0], axis=axis), ufunc.identity)
        data = np.concatenate([head, np.delete(data, -1, axis=axis)], axis=axis)
    # dtype= keeps int32 and float16 from numpy's upcast to the platform integer / itself.
    out = ufunc.accumulate(data, axis=axis, dtype=x.dtype)
    # Contiguous, so the layers after it read memory in order.
    return np.ascontiguousarray(np.flip(out, axis)) if desc.reverse else out


@ref_kernel("CumSum")
def cumsum(desc, x, axis):
    return _cumulative(np.add, desc, x, axis)


@ref_kernel("CumProd")
def cumprod(desc, x, axis):
    return _cumulative(np.multiply, desc, x, axis)
