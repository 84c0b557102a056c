"""Concat and Split kernels."""

from __future__ import annotations

import numpy as np

from flowrt.engine.graph.layers.concat import resolve_split
from flowrt.engine.graph.layers.reshape import const_ints
from flowrt.workers.cpu.ref.kernels import ref_kernel


@ref_kernel("Concat")
def concat(desc, *inputs):
    return np.concatenate(inputs, axis=desc.concat_axis)


@ref_kernel("Split")
def split(desc, data, split=None):
    axis = desc.axis % data.ndim
    bounds = np.cumsum(resolve_split(desc, const_ints(split), data.shape[axis]))[:-1]
    return tuple(np.split(data, bounds, axis=axis))
