"""Tile and Expand kernels."""

from __future__ import annotations

import numpy as np

from flowrt.engine.graph.layers.reshape import const_ints
from flowrt.engine.graph.layers.tile import tile_repeats
from flowrt.engine.graph.shapes import broadcast_shapes
from flowrt.workers.cpu.ref.kernels import ref_kernel


@ref_kernel("Tile")
def tile(desc, data, repeats, axis=None):
    counts = tile_repeats(data.ndim, const_ints(repeats), None if axis is None else int(axis.reshape(-1)[0]))
    return np.tile(data, counts)


@ref_kernel("Expand")
def expand(desc, data, shape):
    out_shape = broadcast_shapes(data.shape, const_ints(shape), where="Expand")
    # A copy: a broadcast view is read-only and its zero strides would surprise the next layer.
    return np.array(np.broadcast_to(data, out_shape))
