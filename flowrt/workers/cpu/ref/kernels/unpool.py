"""MaxUnpool kernel."""

from __future__ import annotations

import numpy as np

from flowrt.engine.graph.layers.reshape import const_ints
from flowrt.engine.graph.layers.unpool import check_indices, requested_shape, unpooled_shape
from flowrt.errors import ShapeError
from flowrt.workers.cpu.ref.kernels import ref_kernel


@ref_kernel("MaxUnpool")
def max_unpool(desc, x, indices, output_shape=None):
    if indices.shape != x.shape:
        raise ShapeError(f"MaxUnpool: indices of X's shape {x.shape} expected, got {indices.shape}")
    shape = tuple(int(d) for d in unpooled_shape(desc, x.shape))  # X's dims are all known here
    size = int(np.prod(shape, dtype=np.int64))
    check_indices(indices, size)
    flat_indices = indices.reshape(-1).astype(np.int64, copy=False)
    # Where indices repeat, the last value wins, as in onnx's reference loop; numpy's
    # fancy assignment does not promise an order, so keep only each index's last occurrence.
    _, last_from_end = np.unique(flat_indices[::-1], return_index=True)
    last = flat_indices.size - 1 - last_from_end
    unpooled = np.zeros(size, dtype=x.dtype)
    unpooled[flat_indices[last]] = x.reshape(-1)[last]
    unpooled = unpooled.reshape(shape)
    if output_shape is None:
        return unpooled
    out = np.zeros(requested_shape(const_ints(output_shape) or [], shape), dtype=x.dtype)
    out[tuple(slice(0, d) for d in shape)] = unpooled
    return out
