"""Reshape, Flatten, Squeeze and Unsqueeze kernels: numpy views with the inferred shape.

The outputs may be views of the inputs (no copy): these layers never change the data.
"""

from __future__ import annotations

import numpy as np

from flowrt.engine.graph.layers.reshape import (
    chosen_axes,
    const_ints,
    reshape_dims,
    squeeze_axes,
    unsqueeze_shape,
)
from flowrt.workers.cpu.ref.kernels import ref_kernel


@ref_kernel("Reshape")
def reshape(desc, data, shape=None):
    target = const_ints(shape) if shape is not None else list(desc.shape)
    return data.reshape(reshape_dims(data.shape, target, bool(desc.allowzero)))


@ref_kernel("Flatten")
def flatten(desc, data):
    axis = desc.axis % data.ndim if desc.axis < 0 else desc.axis
    rows = int(np.prod(data.shape[:axis], dtype=np.int64))
    return data.reshape(rows, int(np.prod(data.shape[axis:], dtype=np.int64)))


@ref_kernel("Squeeze")
def squeeze(desc, data, axes=None):
    drop = squeeze_axes(data.shape, chosen_axes(desc, axes))
    return data.reshape([d for i, d in enumerate(data.shape) if i not in drop])


@ref_kernel("Unsqueeze")
def unsqueeze(desc, data, axes=None):
    return data.reshape(unsqueeze_shape(data.shape, chosen_axes(desc, axes) or []))
