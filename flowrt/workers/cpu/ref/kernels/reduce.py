"""Reduce* and ArgMax / ArgMin kernels.

Every Reduce* kernel hands ``reduce`` one function that reduces over a tuple of axes keeping
them; the shared part resolves the axes, drops them when ``keepdims`` is 0 and restores the
input's dtype. Float16 is accumulated in float32 so that long sums do not lose precision.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import cast

import numpy as np

from flowrt.engine.graph.layers.reduce import reduce_axes, reduced_shape
from flowrt.engine.graph.layers.reshape import const_ints
from flowrt.workers.cpu.ref.kernels import ref_kernel
from flowrt.workers.cpu.ref.kernels.conv import compute_dtype

Reduction = Callable[[np.ndarray, tuple[int, ...]], np.ndarray]


def reduce_over_axes(desc, data: np.ndarray, axes: np.ndarray | None, reduction: Reduction) -> np.ndarray:
    """Apply ``reduction`` over the axes the descriptor and the axes input name."""
    chosen = reduce_axes(desc, data.ndim, const_ints(axes))
    work = data.astype(compute_dtype(data.dtype), copy=False)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        out = np.asarray(reduction(work, chosen))
    # data's dims are ints, so are the reduced ones (reduced_shape is typed for symbolic dims too)
    shape = cast(tuple[int, ...], reduced_shape(data.shape, chosen, bool(desc.keepdims)))
    return out.reshape(shape).astype(data.dtype, copy=False)


def _lowest(dtype: np.dtype) -> object:
    if dtype == np.bool_:
        return False
    return np.iinfo(dtype).min if np.issubdtype(dtype, np.integer) else -np.inf


def _highest(dtype: np.dtype) -> object:
    if dtype == np.bool_:
        return True
    return np.iinfo(dtype).max if np.issubdtype(dtype, np.integer) else np.inf


def _sum(x: np.ndarray, axes: tuple[int, ...]) -> np.ndarray:
    # dtype=x.dtype keeps integer sums in their own type (numpy would widen int32 to int64).
    return np.sum(x, axis=axes, keepdims=True, dtype=x.dtype)


@ref_kernel("ReduceSum")
def reduce_sum(desc, data, axes=None):
    return reduce_over_axes(desc, data, axes, _sum)


def _mean(x: np.ndarray, axes: tuple[int, ...]) -> np.ndarray:
    # Sum over count rather than np.mean, which warns on an empty set (the mean is nan there);
    # an integer mean truncates toward zero, as numpy's and onnx's reference do.
    count = math.prod(x.shape[a] for a in axes)
    return (_sum(x, axes) / count).astype(x.dtype)


@ref_kernel("ReduceMean")
def reduce_mean(desc, data, axes=None):
    return reduce_over_axes(desc, data, axes, _mean)


@ref_kernel("ReduceProd")
def reduce_prod(desc, data, axes=None):
    return reduce_over_axes(desc, data, axes, lambda x, ax: np.prod(x, axis=ax, keepdims=True, dtype=x.dtype))


@ref_kernel("ReduceMax")
def reduce_max(desc, data, axes=None):
    # ``initial`` gives an empty reduction the lowest value, as ONNX asks.
    return reduce_over_axes(
        desc, data, axes, lambda x, ax: np.max(x, axis=ax, keepdims=True, initial=_lowest(x.dtype))
    )


@ref_kernel("ReduceMin")
def reduce_min(desc, data, axes=None):
    return reduce_over_axes(
        desc, data, axes, lambda x, ax: np.min(x, axis=ax, keepdims=True, initial=_highest(x.dtype))
    )


@ref_kernel("ReduceL1")
def reduce_l1(desc, data, axes=None):
    return reduce_over_axes(desc, data, axes, lambda x, ax: _sum(np.abs(x), ax))


@ref_kernel("ReduceL2")
def reduce_l2(desc, data, axes=None):
    return reduce_over_axes(desc, data, axes, lambda x, ax: np.sqrt(_sum(x * x, ax)))


@ref_kernel("ReduceSumSquare")
def reduce_sum_square(desc, data, axes=None):
    return reduce_over_axes(desc, data, axes, lambda x, ax: _sum(x * x, ax))


@ref_kernel("ReduceLogSum")
def reduce_log_sum(desc, data, axes=None):
    return reduce_over_axes(desc, data, axes, lambda x, ax: np.log(_sum(x, ax)))


def log_sum_exp(x: np.ndarray, axes: tuple[int, ...]) -> np.ndarray:
    """log(sum(exp(x))) over ``axes`` (kept), shifted by the max so that exp cannot overflow."""
    peak = np.max(x, axis=axes, keepdims=True, initial=-np.inf)
    # An infinite peak would turn x - peak into nan; shifting by 0 there gives the right +-inf.
    peak = np.where(np.isfinite(peak), peak, 0).astype(x.dtype)
    return np.log(_sum(np.exp(x - peak), axes)) + peak


@ref_kernel("ReduceLogSumExp")
def reduce_log_sum_exp(desc, data, axes=None):
    return reduce_over_axes(desc, data, axes, log_sum_exp)


def arg_reduce(desc, data: np.ndarray, pick: Callable[..., np.ndarray]) -> np.ndarray:
    """ArgMax / ArgMin through ``pick`` (np.argmax or np.argmin), as int64."""
    axis = desc.axis % data.ndim
    if desc.select_last_index:
        # The first index in the reversed axis is the last one in the original.
        index = data.shape[axis] - 1 - pick(np.flip(data, axis), axis=axis)
    else:
        index = pick(data, axis=axis)
    index = np.asarray(index, dtype=np.int64)
    return np.expand_dims(index, axis) if desc.keepdims else index


@ref_kernel("ArgMax")
def arg_max(desc, data):
    return arg_reduce(desc, data, np.argmax)


@ref_kernel("ArgMin")
def arg_min(desc, data):
    return arg_reduce(desc, data, np.argmin)
