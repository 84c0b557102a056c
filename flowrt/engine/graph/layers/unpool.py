"""MaxUnpool: the partial inverse of MaxPool, each value put back where its index says.

The output is zero but for X's values, each at the flat (row-major, over the whole tensor)
position its index gives in the unpooled shape: (N, C, (in - 1) * stride - pad_begin - pad_end +
kernel, ...). An ``output_shape`` input (opset 11 on) names a larger output: the unpooled tensor
fills its leading corner and zeros the rest, as onnx's reference evaluator and its conformance
cases do (ONNX Runtime instead reads the indices as positions in ``output_shape``).
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs
import numpy as np

from flowrt.engine.graph.layer_kind import as_tuple, layer_kind
from flowrt.engine.graph.layers.conv import expect_float, non_negative_ints, positive_ints, spatial_attribute
from flowrt.engine.graph.layers.elementwise import expect_dtype
from flowrt.engine.graph.layers.reshape import const_ints
from flowrt.errors import ShapeError
from flowrt.types import DataType, Dim, TensorInfo

_INDEX_TYPES = frozenset({DataType.INT64})


@attrs.frozen
class MaxUnpoolDescriptor:
    """MaxUnpool (opset 9 on): ``kernel_shape``, ``strides`` (default 1) and ``pads`` (begins
    then ends, default 0) of the MaxPool being inverted."""

    kernel_shape: tuple[int, ...] = attrs.field(
        converter=as_tuple, validator=[attrs.validators.instance_of(tuple), positive_ints]
    )
    pads: tuple[int, ...] | None = attrs.field(default=None, converter=as_tuple, validator=non_negative_ints)
    strides: tuple[int, ...] | None = attrs.field(default=None, converter=as_tuple, validator=positive_ints)


def unpooled_shape(desc: MaxUnpoolDescriptor, x_shape: Sequence[Dim]) -> tuple[Dim, ...]:
    """The shape the indices address: X's N and C, then each spatial dim unpooled (None where
    unknown); ShapeError for attributes that do not fit X's rank or a dim that comes out < 0."""
    spatial = len(x_shape) - 2
    if spatial < 1:
        raise ShapeError(f"MaxUnpool: X of rank >= 3 (N, C, spatial...) expected, got rank {len(x_shape)}")
    if len(desc.kernel_shape) != spatial:
        raise ShapeError(
            f"MaxUnpool: kernel_shape {list(desc.kernel_shape)} needs {len(desc.kernel_shape)} spatial dims, "
            f"got X of rank {len(x_shape)}"
        )
    strides = spatial_attribute(desc.strides, spatial, 1, "MaxUnpool strides")
    pads = spatial_attribute(desc.pads, 2 * spatial, 0, "MaxUnpool pads")
    out: list[Dim] = list(x_shape[:2])
    for axis, d in enumerate(x_shape[2:]):
        if not isinstance(d, int):
            out.append(None)
            continue
        size = (d - 1) * strides[axis] - pads[axis] - pads[spatial + axis] + desc.kernel_shape[axis]
        if size < 0:
            raise ShapeError(
                f"MaxUnpool: spatial axis {axis} of X has {d} cells, which unpool to {size} with "
                f"kernel {desc.kernel_shape[axis]}, stride {strides[axis]} and pads "
                f"({pads[axis]}, {pads[spatial + axis]}); a size >= 0 expected"
            )
        out.append(size)
    return tuple(out)


def requested_shape(requested: Sequence[int], unpooled: Sequence[Dim]) -> tuple[int, ...]:
    """``output_shape`` checked to hold one dim per axis, each at least the unpooled dim."""
    shown = TensorInfo(tuple(unpooled)).format_shape()
    if len(requested) != len(unpooled) or any(
        r < 0 or (isinstance(u, int) and r < u) for r, u in zip(requested, unpooled)
    ):
        raise ShapeError(
            f"MaxUnpool: output_shape of {len(unpooled)} dims, each at least the unpooled shape "
            f"{shown}, expected; got {list(requested)}"
        )
    return tuple(requested)


def check_indices(indices: np.ndarray, size: int) -> None:
    """ShapeError naming the first index outside [0, ``size``), the unpooled element count."""
    bad = (indices < 0) | (indices >= size)
    if bad.any():
        position = tuple(int(i) for i in np.argwhere(bad)[0])
        raise ShapeError(
            f"MaxUnpool: indices must be in [0, {size}) (the unpooled element count), "
            f"got {int(indices[position])} at index {list(position)}"
        )


def _fits(a: Sequence[Dim] | None, b: Sequence[Dim] | None) -> bool:
    """Whether two shapes may be equal: same rank (when known), no two known dims differing."""
    if a is None or b is None:
        return True
    return len(a) == len(b) and not any(
        isinstance(p, int) and isinstance(q, int) and p != q for p, q in zip(a, b)
    )


def _check_operands(x: TensorInfo, indices: TensorInfo, output_shape: TensorInfo | None) -> None:
    expect_float(x, "MaxUnpool X")
    expect_dtype(indices, _INDEX_TYPES, "MaxUnpool indices")
    if output_shape is not None:
        expect_dtype(output_shape, _INDEX_TYPES, "MaxUnpool output_shape")
        if output_shape.shape is not None and len(output_shape.shape) != 1:
            raise ShapeError(f"MaxUnpool: output_shape must be 1-D, got shape {output_shape.format_shape()}")
    if not _fits(indices.shape, x.shape):
        raise ShapeError(
            f"MaxUnpool: indices of X's shape {x.format_shape()} expected, got {indices.format_shape()}"
        )


@layer_kind("MaxUnpool", MaxUnpoolDescriptor, min_inputs=2, max_inputs=3)
def infer_max_unpool(desc: MaxUnpoolDescriptor, inputs, consts):
    x, indices = inputs[0], inputs[1]
    output_shape = inputs[2] if len(inputs) > 2 else None
    _check_operands(x, indices, output_shape)
    rank = len(desc.kernel_shape) + 2
    known = x.shape if x.shape is not None else indices.shape
    unpooled = unpooled_shape(desc, known if known is not None else (None,) * rank)
    size = TensorInfo(unpooled).num_elements
    if consts[1] is not None and size is not None:
        check_indices(np.asarray(consts[1]), size)
    if output_shape is None:
        return [TensorInfo(unpooled, x.dtype)]
    requested = const_ints(consts[2])
    if requested is None:
        length = None if output_shape.shape is None else output_shape.shape[0]
        if isinstance(length, int) and length != rank:
            raise ShapeError(
                f"MaxUnpool: output_shape of {rank} dims expected, got {output_shape.format_shape()}"
            )
        return [TensorInfo((None,) * rank, x.dtype)]
    return [TensorInfo(requested_shape(requested, unpooled), x.dtype)]
