"""Reshape, Flatten, Squeeze and Unsqueeze kernels: numpy views with the inferred shape.

The outputs may be views of the inputs (no copy): these layers never change the data. The
shapes come from the layers' own module (``VIEW_SHAPES``), which every backend shares.
"""

from __future__ import annotations

from flowrt.engine.graph.layers.reshape import (
    flattened_shape,
    reshaped_shape,
    squeezed_shape,
    unsqueezed_shape,
)
from flowrt.workers.cpu.ref.kernels import ref_kernel


@ref_kernel("Reshape")
def reshape(desc, data, shape=None):
    return data.reshape(reshaped_shape(desc, data.shape, shape))


@ref_kernel("Flatten")
def flatten(desc, data):
    return data.reshape(flattened_shape(desc, data.shape))


@ref_kernel("Squeeze")
def squeeze(desc, data, axes=None):
    return data.reshape(squeezed_shape(desc, data.shape, axes))


@ref_kernel("Unsqueeze")
def unsqueeze(desc, data, axes=None):
    return data.reshape(unsqueezed_shape(desc, data.shape, axes))
