"""Shape, Size, ConstantOfShape, Range and OneHot kernels."""

from __future__ import annotations

import numpy as np

from flowrt.engine.graph.layers.reshape import const_ints
from flowrt.engine.graph.layers.shape import range_length
from flowrt.workers.cpu.ref.kernels import ref_kernel

# From opset 27, float16 Range is computed in the stash type.
_STASH_DTYPES = {1: np.float32, 11: np.float64}


@ref_kernel("Shape")
def shape(desc, data):
    return np.array(data.shape[desc.start : desc.end], dtype=np.int64)


@ref_kernel("Size")
def size(desc, data):
    return np.array(data.size, dtype=np.int64)


@ref_kernel("ConstantOfShape")
def constant_of_shape(desc, dims):
    return np.full(const_ints(dims), desc.fill, dtype=desc.fill.dtype)


@ref_kernel("Range")
def range_(desc, start, limit, delta):
    dtype = start.dtype
    count = range_length(start.item(), limit.item(), delta.item())
    if dtype.kind in "iu":
        return (start + np.arange(count, dtype=np.int64) * delta).astype(dtype)
    compute = _STASH_DTYPES[desc.stash_type] if desc.opset >= 27 and dtype == np.float16 else np.float64
    steps = np.arange(count, dtype=compute)
    return (start.astype(compute) + steps * delta.astype(compute)).astype(dtype)


@ref_kernel("OneHot")
def one_hot(desc, indices, depth, values):
    depth = int(np.asarray(depth).reshape(-1)[0])
    axis = desc.axis % (indices.ndim + 1)
    index = indices.astype(np.int64)
    index = np.where(index < 0, index + depth, index)
    positions = np.arange(depth).reshape((depth,) + (1,) * (indices.ndim - axis))
    hot = np.expand_dims(index, axis) == positions
    off, on = values.reshape(-1)[:2]
    return np.where(hot, on, off).astype(values.dtype)
