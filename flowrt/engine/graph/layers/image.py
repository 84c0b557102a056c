"""Col2Im, CenterCropPad and MaxRoiPool: operators that rearrange or crop image regions.

Col2Im's and CenterCropPad's output dims are input values (image_shape, shape): known when
those inputs are constants, else decided when the layer runs.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import attrs

from flowrt.engine.graph.layer_kind import layer_kind
from flowrt.engine.graph.layers.detection import expect_dims
from flowrt.engine.graph.layers.elementwise import NUMERIC_TYPES, expect_dtype
from flowrt.engine.graph.layers.grid import GRID_FLOATS
from flowrt.engine.graph.layers.reshape import const_ints
from flowrt.errors import DataTypeError, ShapeError
from flowrt.types import DataType, Dim, TensorInfo

_I64 = frozenset({DataType.INT64})


def _optional_ints(value: Sequence[int] | None) -> tuple[int, ...] | None:
    return None if value is None else tuple(int(v) for v in value)


@attrs.frozen
class Col2ImDescriptor:
    """Col2Im: the inverse of im2col. Input [N, C * prod(block_shape), L] holds L blocks, one
    column each; every block value is added to the image pixel it came from (overlaps sum),
    with ``strides``, ``pads`` (begins then ends) and ``dilations`` as in Conv (absent: 1, 0, 1
    per dim)."""

    strides: tuple[int, ...] | None = attrs.field(default=None, converter=_optional_ints)
    pads: tuple[int, ...] | None = attrs.field(default=None, converter=_optional_ints)
    dilations: tuple[int, ...] | None = attrs.field(default=None, converter=_optional_ints)

    def geometry(self, rank: int) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]:
        """(strides, pads, dilations) for ``rank`` spatial dims; ShapeError on a wrong count."""
        strides = self.strides or (1,) * rank
        pads = self.pads or (0,) * (2 * rank)
        dilations = self.dilations or (1,) * rank
        for name, values, count in (
            ("strides", strides, rank),
            ("pads", pads, 2 * rank),
            ("dilations", dilations, rank),
        ):
            if len(values) != count:
                raise ShapeError(
                    f"Col2Im: {count} {name} for {rank} spatial dims expected, got {list(values)}"
                )
        if min(strides) < 1 or min(dilations) < 1 or min(pads) < 0:
            raise ShapeError(
                f"Col2Im: positive strides and dilations and non-negative pads expected, got "
                f"strides {list(strides)}, dilations {list(dilations)}, pads {list(pads)}"
            )
        return strides, pads, dilations


def col2im_blocks(desc: Col2ImDescriptor, image: Sequence[int], block: Sequence[int]) -> list[int]:
    """The number of block positions along each image dim; ShapeError when image_shape and
    block_shape do not fit each other or the attributes."""
    if len(image) != len(block) or not image:
        raise ShapeError(
            f"Col2Im: image_shape and block_shape of one value per spatial dim expected, got {list(image)} and {list(block)}"
        )
    strides, pads, dilations = desc.geometry(len(image))
    rank = len(image)
    counts = [
        (image[i] + pads[i] + pads[i + rank] - dilations[i] * (block[i] - 1) - 1) // strides[i] + 1
        for i in range(rank)
    ]
    if min(block) < 1 or min(image) < 1 or min(counts) < 1:
        raise ShapeError(
            f"Col2Im: image_shape {list(image)} cannot hold a block {list(block)} "
            f"(with the pads and dilations): block positions per dim {counts}"
        )
    return counts


def col2im_dims(
    desc: Col2ImDescriptor, data: TensorInfo, image: list[int] | None, block: list[int] | None, rank: Dim
) -> tuple[Dim, ...] | None:
    """The output shape [N, C, *image_shape] as far as known; ShapeError where the input's
    dims 1 and 2 do not match the blocks."""
    if data.shape is None:
        return None
    batch, columns, length = data.shape
    channels: Dim = None
    if block is not None:
        block_size = math.prod(block)
        if isinstance(columns, int) and (block_size < 1 or columns % block_size):
            raise ShapeError(
                f"Col2Im: input dim 1 ({columns}) is not a multiple of prod(block_shape) {block}"
            )
        channels = columns // block_size if isinstance(columns, int) else None
    if image is not None and block is not None:
        count = math.prod(col2im_blocks(desc, image, block))
        if isinstance(length, int) and length != count:
            raise ShapeError(
                f"Col2Im: input dim 2 of {count} block positions expected (image_shape {image}, "
                f"block_shape {block}), got {length}"
            )
    if image is not None:
        return (batch, channels, *image)
    return None if not isinstance(rank, int) else (batch, channels, *[None] * rank)


@layer_kind("Col2Im", Col2ImDescriptor, min_inputs=3, max_inputs=3)
def infer_col2im(desc: Col2ImDescriptor, inputs, consts):
    where = "Col2Im"
    data, image_shape, block_shape = inputs
    expect_dtype(data, NUMERIC_TYPES - {DataType.BFLOAT16}, f"{where} input")
    expect_dims(data, (None, None, None), "input [N, C * prod(block_shape), L]", where)
    for info, name in ((image_shape, "image_shape"), (block_shape, "block_shape")):
        expect_dtype(info, _I64, f"{where} input {name}")
        expect_dims(info, (None,), f"{name} (1-D)", where)
    rank = image_shape.shape[0] if image_shape.shape is not None else None
    dims = col2im_dims(desc, data, const_ints(consts[1]), const_ints(consts[2]), rank)
    return [TensorInfo(dims, data.dtype)]


@attrs.frozen
class CenterCropPadDescriptor:
    """CenterCropPad: each of ``axes`` (all, if absent; negative from the end) cropped or
    zero-padded to the size ``shape`` gives it, centered (an odd difference puts the extra
    element at the end)."""

    axes: tuple[int, ...] | None = attrs.field(default=None, converter=_optional_ints)


def center_crop_axes(desc: CenterCropPadDescriptor, rank: int) -> list[int]:
    """The axes, non-negative; ShapeError when one is out of range or repeated."""
    axes = list(range(rank)) if desc.axes is None else [a + rank if a < 0 else a for a in desc.axes]
    if any(not 0 <= a < rank for a in axes) or len(set(axes)) != len(axes):
        raise ShapeError(
            f"CenterCropPad: distinct axes in [-{rank}, {rank}) expected, got {list(desc.axes or ())}"
        )
    return axes


@layer_kind("CenterCropPad", CenterCropPadDescriptor, min_inputs=2, max_inputs=2)
def infer_center_crop_pad(desc: CenterCropPadDescriptor, inputs, consts):
    where = "CenterCropPad"
    data, shape = inputs
    if data.dtype is DataType.BFLOAT16:
        raise DataTypeError(f"{where}: input of a type with a numpy dtype expected, got bfloat16")
    expect_dtype(shape, frozenset({DataType.INT32, DataType.INT64}), f"{where} input shape")
    if data.shape is None:
        return [TensorInfo(None, data.dtype)]
    axes = center_crop_axes(desc, len(data.shape))
    expect_dims(shape, (len(axes),), f"shape (one value per axis, {len(axes)})", where)
    sizes = const_ints(consts[1])
    dims = list(data.shape)
    for i, axis in enumerate(axes):
        dims[axis] = None if sizes is None else sizes[i]
    if sizes is not None and min(sizes, default=0) < 0:
        raise ShapeError(f"{where}: non-negative sizes expected, got {sizes}")
    return [TensorInfo(tuple(dims), data.dtype)]


@attrs.frozen
class MaxRoiPoolDescriptor:
    """MaxRoiPool: each region of interest ([batch index, x1, y1, x2, y2], times
    ``spatial_scale`` and rounded to pixels, at least 1x1) cut into ``pooled_shape``
    (height, width) bins, each the maximum of its pixels (an empty bin: 0)."""

    pooled_shape: tuple[int, ...] = attrs.field(converter=_optional_ints)
    spatial_scale: float = attrs.field(default=1.0, validator=attrs.validators.gt(0))

    @pooled_shape.validator
    def _two_positive(self, attribute, value) -> None:
        if value is None or len(value) != 2 or min(value) < 1:
            raise ValueError(f"pooled_shape of two positive ints (height, width) expected, got {value}")


@layer_kind("MaxRoiPool", MaxRoiPoolDescriptor, min_inputs=2, max_inputs=2)
def infer_max_roi_pool(desc: MaxRoiPoolDescriptor, inputs, consts):
    where = "MaxRoiPool"
    x, rois = inputs
    expect_dtype(x, GRID_FLOATS, f"{where} input X")
    if rois.dtype != x.dtype:
        raise DataTypeError(
            f"{where}: rois of X's type {x.dtype.name.lower()} expected, got {rois.dtype.name.lower()}"
        )
    expect_dims(x, (None, None, None, None), "X [N, C, H, W]", where)
    expect_dims(rois, (None, 5), "rois [num_rois, 5] (batch index, x1, y1, x2, y2)", where)
    num_rois = None if rois.shape is None else rois.shape[0]
    channels = None if x.shape is None else x.shape[1]
    return [TensorInfo((num_rois, channels, *desc.pooled_shape), x.dtype)]
