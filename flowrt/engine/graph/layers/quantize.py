"""QuantizeLinear, DequantizeLinear and DynamicQuantizeLinear: affine conversions between real
numbers and a quantized type, real = scale * (q - zero_point).

The quantized types are the 16-, 8-, 4- and 2-bit integers, the float8 types but e8m0, the
float6 types and float4e2m1. The scale and zero point are per tensor (a scalar or one
element), per axis (1-D, one per slice along ``axis``, opset 13 on) or per block (opset 21 on:
the input's shape with ``axis`` divided into blocks of ``block_size``). A float8e8m0 scale
(opset 23 on) holds powers of two, as the MX formats use.
"""

from __future__ import annotations

import math

import attrs

from flowrt.engine.graph.layer_kind import layer_kind
from flowrt.engine.graph.layers.elementwise import FLOAT_TYPES, expect_dtype, onnx_dtype_to_datatype
from flowrt.engine.graph.shapes import broadcast_shapes, normalize_axis
from flowrt.errors import DataTypeError, GraphError, ShapeError
from flowrt.types import DataType, Dim, TensorInfo

D = DataType
QUANTIZED_INT_TYPES = frozenset({D.UINT8, D.INT8, D.UINT16, D.INT16, D.UINT4, D.INT4, D.UINT2, D.INT2})
QUANTIZED_FLOAT_TYPES = frozenset({
    D.FLOAT8E4M3FN, D.FLOAT8E4M3FNUZ, D.FLOAT8E5M2, D.FLOAT8E5M2FNUZ, D.FLOAT6E2M3, D.FLOAT6E3M2, D.FLOAT4E2M1,
})  # fmt: skip
QUANTIZED_TYPES = QUANTIZED_INT_TYPES | QUANTIZED_FLOAT_TYPES
# DequantizeLinear also reads int32 (e.g. a quantized bias).
DEQUANTIZABLE_TYPES = QUANTIZED_TYPES | {D.INT32}
SCALE_TYPES = FLOAT_TYPES | {D.FLOAT8E8M0}
_block_size_field = attrs.field(default=0, validator=attrs.validators.ge(0))


@attrs.frozen
class QuantizeLinearDescriptor:
    """QuantizeLinear: q = saturate(round(x / scale) + zero_point), rounding half to even.

    The output type is the zero point's, else ``output_dtype`` (an ONNX type number, opset 21
    on), else uint8. ``precision`` (opset 23 on) names the float type the division runs in.
    A float output is ``x / scale + zero_point`` cast as Cast does; ``saturate`` applies to
    float8 outputs as Cast's does.
    """

    axis: int = 1
    saturate: int = attrs.field(default=1, validator=attrs.validators.in_((0, 1)))
    block_size: int = _block_size_field
    output_dtype: int = 0
    precision: int = 0


@attrs.frozen
class DequantizeLinearDescriptor:
    """DequantizeLinear: y = (x - zero_point) * scale, of the scale's type or, when set,
    ``output_dtype`` (an ONNX type number, opset 23 on)."""

    axis: int = 1
    block_size: int = _block_size_field
    output_dtype: int = 0


def quantized_type(desc: QuantizeLinearDescriptor, zero_point: DataType | None) -> DataType:
    """QuantizeLinear's output type; DataTypeError when it is not one flowrt quantizes to or
    when ``output_dtype`` and the zero point disagree."""
    wanted = onnx_dtype_to_datatype(desc.output_dtype) if desc.output_dtype else None
    if zero_point is not None and wanted is not None and zero_point != wanted:
        raise DataTypeError(
            f"QuantizeLinear: output_dtype {wanted.name.lower()} and zero point {zero_point.name.lower()} disagree"
        )
    target = zero_point or wanted or D.UINT8
    if target not in QUANTIZED_TYPES:
        names = ", ".join(sorted(d.name.lower() for d in QUANTIZED_TYPES))
        raise DataTypeError(
            f"QuantizeLinear: an output of one of {names} expected, got {target.name.lower()}"
        )
    return target


def precision_type(desc: QuantizeLinearDescriptor) -> DataType | None:
    """The float type QuantizeLinear divides in, or None for numpy's choice."""
    if not desc.precision:
        return None
    dtype = onnx_dtype_to_datatype(desc.precision)
    if dtype not in FLOAT_TYPES:
        raise DataTypeError(
            f"QuantizeLinear: a bfloat16, float16, float32 or float64 precision expected, got {dtype.name.lower()}"
        )
    return dtype


def dequantized_type(desc: DequantizeLinearDescriptor, scale: DataType) -> DataType:
    """DequantizeLinear's output type: ``output_dtype`` when set, else the scale's (which must
    then not be float8e8m0: ONNX requires ``output_dtype`` with such a scale)."""
    target = onnx_dtype_to_datatype(desc.output_dtype) if desc.output_dtype else scale
    if target not in FLOAT_TYPES:
        raise DataTypeError(f"DequantizeLinear: a float output expected, got {target.name.lower()}")
    return target


def _is_per_tensor(shape: tuple[Dim, ...]) -> bool:
    return len(shape) == 0 or (len(shape) == 1 and shape[0] == 1)


def check_quant_params(
    x: TensorInfo, param: TensorInfo | None, axis: int, block_size: int, what: str
) -> None:
    """ShapeError when a scale or zero point fits neither per-tensor, per-axis nor (with a
    ``block_size``) per-block quantization of ``x``."""
    if param is None or param.shape is None or x.shape is None or _is_per_tensor(param.shape):
        return
    rank = len(x.shape)
    a = normalize_axis(axis, rank, what)
    if block_size:
        expected = tuple(
            math.ceil(d / block_size) if i == a and isinstance(d, int) else d for i, d in enumerate(x.shape)
        )
    else:
        expected = (x.shape[a],)
    conflict = len(param.shape) != len(expected) or any(
        isinstance(p, int) and isinstance(e, int) and p != e for p, e in zip(param.shape, expected)
    )
    if conflict:
        shown = TensorInfo(expected).format_shape()
        raise ShapeError(
            f"{what} of shape () or {shown} expected for input {x.format_shape()}, got {param.format_shape()}"
        )


def _check_params(desc, x: TensorInfo, scale: TensorInfo, zero_point: TensorInfo | None) -> None:
    check_quant_params(x, scale, desc.axis, desc.block_size, "scale")
    check_quant_params(x, zero_point, desc.axis, desc.block_size, "zero point")


@layer_kind("QuantizeLinear", QuantizeLinearDescriptor, min_inputs=2, max_inputs=3)
def infer_quantize_linear(desc: QuantizeLinearDescriptor, inputs, consts):
    x, scale = inputs[:2]
    zero_point = inputs[2] if len(inputs) > 2 else None
    expect_dtype(x, FLOAT_TYPES | {D.INT32}, "input x")
    expect_dtype(scale, SCALE_TYPES | {D.INT32}, "scale")
    precision_type(desc)
    _check_params(desc, x, scale, zero_point)
    return [x.with_dtype(quantized_type(desc, None if zero_point is None else zero_point.dtype))]


@layer_kind("DequantizeLinear", DequantizeLinearDescriptor, min_inputs=2, max_inputs=3)
def infer_dequantize_linear(desc: DequantizeLinearDescriptor, inputs, consts):
    x, scale = inputs[:2]
    zero_point = inputs[2] if len(inputs) > 2 else None
    expect_dtype(x, DEQUANTIZABLE_TYPES, "input x")
    expect_dtype(scale, SCALE_TYPES, "scale")
    if zero_point is not None and zero_point.dtype != x.dtype:
        raise DataTypeError(
            f"DequantizeLinear: a zero point of x's type {x.dtype.name.lower()} expected, got {zero_point.dtype.name.lower()}"
        )
    _check_params(desc, x, scale, zero_point)
    return [x.with_dtype(dequantized_type(desc, scale.dtype))]


@layer_kind("DynamicQuantizeLinear", num_outputs=3)
def infer_dynamic_quantize_linear(desc, inputs, consts):
    x = inputs[0]
    expect_dtype(x, frozenset({D.FLOAT32}), "input x")
    return [x.with_dtype(D.UINT8), TensorInfo((), D.FLOAT32), TensorInfo((), D.UINT8)]


# QLinearAdd and QLinearMul: flowrt's, made by the QDQ fold (``passes/fold_qdq.py``) from a
# DequantizeLinear -> Add or Mul -> QuantizeLinear group, as ONNX Runtime's com.microsoft ops
# of those names are, with one addition: B may be float32 (a float constant beside a
# dequantized input), then with scale 1 and zero point 0 of its own type.
QLINEAR_BINARY_KINDS = ("QLinearAdd", "QLinearMul")
_B_TYPES = frozenset({D.UINT8, D.INT8, D.FLOAT32})


def _one_float32(info: TensorInfo, what: str) -> None:
    expect_dtype(info, frozenset({D.FLOAT32}), what)
    if info.shape is not None and info.is_static and info.num_elements != 1:
        raise ShapeError(f"{what} must hold one value, got shape {info.shape}")


def _zero_of(zero: TensorInfo, values: TensorInfo, what: str) -> None:
    if zero.dtype != values.dtype:
        raise DataTypeError(
            f"{what}: a zero point of its input's type {values.dtype.name.lower()} expected, got {zero.dtype.name.lower()}"
        )
    if zero.shape is not None and zero.is_static and zero.num_elements != 1:
        raise ShapeError(f"{what}: the zero point must hold one value, got shape {zero.shape}")


@layer_kind(QLINEAR_BINARY_KINDS, min_inputs=2, max_inputs=8)
def infer_qlinear_binary(desc, inputs, consts):
    """``C = quantize(dequantize(A) op dequantize(B))``: per-tensor scales and zero points,
    A and C uint8 or int8, B uint8, int8 or float32, broadcasting as Add and Mul do.

    The zero points are optional, as in ONNX Runtime's schema (an empty input name, or C's
    left off the end): an absent one is 0 of its tensor's type, and C is then of A's type.
    The other five inputs must be connected (GraphError naming the one that is not)."""
    padded = [*inputs, *[None] * (8 - len(inputs))]
    for index, name in ((0, "A"), (1, "A_scale"), (3, "B"), (4, "B_scale"), (6, "C_scale")):
        if padded[index] is None:
            raise GraphError(
                f"QLinear binary op: input {index} ({name}) must be connected; "
                "only the zero points are optional"
            )
    a, a_scale, a_zero, b, b_scale, b_zero, c_scale, c_zero = padded
    expect_dtype(a, frozenset({D.UINT8, D.INT8}), "input A")
    expect_dtype(b, _B_TYPES, "input B")
    for info, what in ((a_scale, "A's scale"), (b_scale, "B's scale"), (c_scale, "C's scale")):
        _one_float32(info, what)
    if a_zero is not None:
        _zero_of(a_zero, a, "A")
    if b_zero is not None:
        _zero_of(b_zero, b, "B")
    c_type = a.dtype
    if c_zero is not None:
        expect_dtype(c_zero, frozenset({D.UINT8, D.INT8}), "C's zero point")
        if c_zero.shape is not None and c_zero.is_static and c_zero.num_elements != 1:
            raise ShapeError(f"C's zero point must hold one value, got shape {c_zero.shape}")
        c_type = c_zero.dtype
    return [TensorInfo(broadcast_shapes(a.shape, b.shape, where="QLinear binary op"), c_type)]
