"""Pooling layers: MaxPool, AveragePool and LpPool over sliding windows, and their global forms.

The windowed kinds resolve output sizes and pads with the same :func:`window_geometry` as Conv.
"""

from __future__ import annotations

import attrs

from flowrt.engine.graph.layer_kind import NoDescriptor, as_tuple, layer_kind
from flowrt.engine.graph.layers.conv import (
    auto_pad_field,
    expect_float,
    non_negative_ints,
    positive_ints,
    spatial_attribute,
    window_geometry,
)
from flowrt.errors import ShapeError
from flowrt.types import DataType, TensorInfo

_INT8_TYPES = frozenset({DataType.INT8, DataType.UINT8})


def _kernel_field():
    return attrs.field(converter=as_tuple, validator=[attrs.validators.instance_of(tuple), positive_ints])


def _optional_ints(validator):
    return attrs.field(default=None, converter=as_tuple, validator=validator)


@attrs.frozen
class MaxPoolDescriptor:
    """MaxPool: the largest value of each window. With two outputs the second holds the flat
    index of that value in the input (row-major, or column-major over the spatial dims when
    ``storage_order`` is 1)."""

    kernel_shape: tuple[int, ...] = _kernel_field()
    auto_pad: str = auto_pad_field()
    ceil_mode: int = 0
    dilations: tuple[int, ...] | None = _optional_ints(positive_ints)
    pads: tuple[int, ...] | None = _optional_ints(non_negative_ints)
    storage_order: int = attrs.field(default=0, validator=attrs.validators.in_((0, 1)))
    strides: tuple[int, ...] | None = _optional_ints(positive_ints)
    num_outputs: int = attrs.field(default=1, validator=attrs.validators.in_((1, 2)))


@attrs.frozen
class AveragePoolDescriptor:
    """AveragePool: the mean of each window; padding cells count towards the divisor only with
    ``count_include_pad`` (cells that ceil mode adds past the trailing pads never count)."""

    kernel_shape: tuple[int, ...] = _kernel_field()
    auto_pad: str = auto_pad_field()
    ceil_mode: int = 0
    count_include_pad: int = 0
    dilations: tuple[int, ...] | None = _optional_ints(positive_ints)
    pads: tuple[int, ...] | None = _optional_ints(non_negative_ints)
    strides: tuple[int, ...] | None = _optional_ints(positive_ints)


@attrs.frozen
class LpPoolDescriptor:
    """LpPool: the p-norm (sum |x|^p)^(1/p) of each window, padding read as zeros. ``p`` was a
    float in opset 1 and an int since."""

    kernel_shape: tuple[int, ...] = _kernel_field()
    auto_pad: str = auto_pad_field()
    ceil_mode: int = 0
    dilations: tuple[int, ...] | None = _optional_ints(positive_ints)
    p: float = attrs.field(default=2, validator=attrs.validators.gt(0))
    pads: tuple[int, ...] | None = _optional_ints(non_negative_ints)
    strides: tuple[int, ...] | None = _optional_ints(positive_ints)


@attrs.frozen
class GlobalLpPoolDescriptor:
    """GlobalLpPool: the p-norm over all spatial cells of each channel."""

    p: float = attrs.field(default=2, validator=attrs.validators.gt(0))


def pool_geometry(desc, spatial):
    """The window geometry of a pooling descriptor over input spatial dims ``spatial``."""
    kernel = spatial_attribute(desc.kernel_shape, len(spatial), 1, "kernel_shape")
    return window_geometry(desc, spatial, kernel, ceil_mode=bool(desc.ceil_mode))


def _pooled_shape(desc, x: TensorInfo, what: str):
    shape = x.shape if x.shape is not None else (None,) * (len(desc.kernel_shape) + 2)
    rank = len(shape)
    if rank < 3:
        raise ShapeError(f"{what} expects data of rank >= 3 (N, C, spatial...), got shape {x.format_shape()}")
    if len(desc.kernel_shape) != rank - 2:
        raise ShapeError(
            f"{what} kernel_shape {list(desc.kernel_shape)} needs {len(desc.kernel_shape)} spatial dims, "
            f"got data of shape {x.format_shape()}"
        )
    return (*shape[:2], *pool_geometry(desc, shape[2:]).out)


@layer_kind("MaxPool", MaxPoolDescriptor, num_outputs=None)
def infer_max_pool(desc: MaxPoolDescriptor, inputs, consts):
    x = inputs[0]
    if x.dtype not in _INT8_TYPES:
        expect_float(x, "MaxPool")
    shape = _pooled_shape(desc, x, "MaxPool")
    infos = [TensorInfo(shape, x.dtype), TensorInfo(shape, DataType.INT64)]
    return infos[: desc.num_outputs]


@layer_kind("AveragePool", AveragePoolDescriptor)
def infer_average_pool(desc: AveragePoolDescriptor, inputs, consts):
    expect_float(inputs[0], "AveragePool")
    return [TensorInfo(_pooled_shape(desc, inputs[0], "AveragePool"), inputs[0].dtype)]


@layer_kind("LpPool", LpPoolDescriptor)
def infer_lp_pool(desc: LpPoolDescriptor, inputs, consts):
    expect_float(inputs[0], "LpPool")
    return [TensorInfo(_pooled_shape(desc, inputs[0], "LpPool"), inputs[0].dtype)]


def _infer_global(what: str):
    def infer(desc, inputs, consts):
        x = inputs[0]
        expect_float(x, what)
        if x.shape is None:
            return [TensorInfo(None, x.dtype)]
        if len(x.shape) < 3:
            raise ShapeError(
                f"{what} expects data of rank >= 3 (N, C, spatial...), got shape {x.format_shape()}"
            )
        return [TensorInfo((*x.shape[:2], *([1] * (len(x.shape) - 2))), x.dtype)]

    return infer


layer_kind("GlobalAveragePool", NoDescriptor)(_infer_global("GlobalAveragePool"))
layer_kind("GlobalMaxPool", NoDescriptor)(_infer_global("GlobalMaxPool"))
layer_kind("GlobalLpPool", GlobalLpPoolDescriptor)(_infer_global("GlobalLpPool"))
