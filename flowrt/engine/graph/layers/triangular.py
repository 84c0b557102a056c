"""Trilu and EyeLike: layers that keep or make the triangle or diagonal of matrices."""

from __future__ import annotations

import attrs

from flowrt.engine.graph.layer_kind import layer_kind
from flowrt.engine.graph.layers.elementwise import ANY_TYPE, expect_dtype, onnx_dtype_to_datatype
from flowrt.errors import DataTypeError, ShapeError
from flowrt.types import DataType, TensorInfo


@attrs.frozen
class TriluDescriptor:
    """Trilu: keep the upper (``upper`` 1) or lower (0) triangle of the last two dims, counted
    from the diagonal moved by the optional ``k`` input (positive: up and right)."""

    upper: int = attrs.field(default=1, validator=attrs.validators.in_((0, 1)))


@layer_kind("Trilu", TriluDescriptor, min_inputs=1, max_inputs=2)
def infer_trilu(desc: TriluDescriptor, inputs, consts):
    x = inputs[0]
    if x.shape is not None and len(x.shape) < 2:
        raise ShapeError(f"Trilu: an input of rank 2 or more expected, got {x.format_shape()}")
    if len(inputs) > 1 and inputs[1] is not None:
        expect_dtype(inputs[1], frozenset({DataType.INT64}), "Trilu's k")
        if inputs[1].shape is not None and len(inputs[1].shape) != 0:
            raise ShapeError(f"Trilu: k must be a scalar, got shape {inputs[1].format_shape()}")
    return [x]


_EYE_TYPES = ANY_TYPE - {DataType.STRING}


@attrs.frozen
class EyeLikeDescriptor:
    """EyeLike: a 2-D tensor of the input's shape with ones on diagonal ``k`` (positive: above
    the main one); of the ONNX data type number ``dtype``, or the input's when unset."""

    dtype: int | None = None
    k: int = 0


def eye_like_dtype(desc: EyeLikeDescriptor, input_dtype: DataType) -> DataType:
    """The output data type: ``dtype`` when set, else the input's; DataTypeError for one
    EyeLike cannot produce."""
    dtype = input_dtype if desc.dtype is None else onnx_dtype_to_datatype(desc.dtype)
    if dtype not in _EYE_TYPES:
        raise DataTypeError(f"EyeLike expects a numeric or bool data type, got {dtype.name.lower()}")
    return dtype


@layer_kind("EyeLike", EyeLikeDescriptor)
def infer_eye_like(desc: EyeLikeDescriptor, inputs, consts):
    x = inputs[0]
    expect_dtype(x, _EYE_TYPES, "EyeLike's input")
    if x.shape is not None and len(x.shape) != 2:
        raise ShapeError(f"EyeLike: a 2-D input expected, got {x.format_shape()}")
    return [TensorInfo((None, None) if x.shape is None else x.shape, eye_like_dtype(desc, x.dtype))]
