"""ConvInteger and QLinearConv: convolutions of 8-bit integers, with Conv's attributes
(``ConvDescriptor``) and shape rules.

ConvInteger: y (int32) = conv(x - x_zero_point, w - w_zero_point), the padding being zeros
after the subtraction (``x_zero_point`` in x's own terms). QLinearConv: that sum plus an int32
bias ``B``, requantized: y = saturate(round_half_even(sum * x_scale * w_scale / y_scale) +
y_zero_point), of ``y_zero_point``'s type. ``x_scale``, ``x_zero_point``, ``y_scale`` and
``y_zero_point`` are per tensor; ``w_scale`` and ``w_zero_point`` per tensor or one per output
channel.
"""

from __future__ import annotations

from flowrt.engine.graph.layer_kind import layer_kind
from flowrt.engine.graph.layers.conv import ConvDescriptor, conv_output_shape
from flowrt.errors import DataTypeError, ShapeError
from flowrt.types import DataType, TensorInfo

D = DataType
INT8_TYPES = frozenset({D.INT8, D.UINT8})


def _expect(info: TensorInfo | None, name: str, types: frozenset[DataType], what: str) -> None:
    if info is not None and info.dtype not in types:
        names = " or ".join(sorted(t.name.lower() for t in types))
        raise DataTypeError(f"{what} expects {name} of {names}, got {info.dtype.name.lower()}")


def _expect_zero_point(zero_point: TensorInfo | None, of: TensorInfo, name: str, what: str) -> None:
    if zero_point is not None and zero_point.dtype != of.dtype:
        raise DataTypeError(
            f"{what} expects {name} of its tensor's type {of.dtype.name.lower()}, "
            f"got {zero_point.dtype.name.lower()}"
        )


def _expect_per_tensor(info: TensorInfo | None, name: str, what: str) -> None:
    if info is None or info.shape is None:
        return
    if any(isinstance(d, int) and d != 1 for d in info.shape):
        raise ShapeError(
            f"{what} expects {name} of one element (per tensor), got shape {info.format_shape()}"
        )


@layer_kind("ConvInteger", ConvDescriptor, min_inputs=2, max_inputs=4)
def infer_conv_integer(desc: ConvDescriptor, inputs, consts):
    x, w, x_zero_point, w_zero_point = (list(inputs) + [None, None])[:4]
    _expect(x, "x", INT8_TYPES, "ConvInteger")
    _expect(w, "w", INT8_TYPES, "ConvInteger")
    _expect_zero_point(x_zero_point, x, "x_zero_point", "ConvInteger")
    _expect_zero_point(w_zero_point, w, "w_zero_point", "ConvInteger")
    _expect_per_tensor(x_zero_point, "x_zero_point", "ConvInteger")
    return [TensorInfo(conv_output_shape(desc, x, w, None, "ConvInteger"), D.INT32)]


@layer_kind("QLinearConv", ConvDescriptor, min_inputs=8, max_inputs=9)
def infer_qlinear_conv(desc: ConvDescriptor, inputs, consts):
    x, x_scale, x_zero_point, w, w_scale, w_zero_point, y_scale, y_zero_point, b = (list(inputs) + [None])[:9]
    what = "QLinearConv"
    for info, name in ((x, "x"), (w, "w"), (y_zero_point, "y_zero_point")):
        _expect(info, name, INT8_TYPES, what)
    for info, name in ((x_scale, "x_scale"), (w_scale, "w_scale"), (y_scale, "y_scale")):
        _expect(info, name, frozenset({D.FLOAT32}), what)
    _expect(b, "B", frozenset({D.INT32}), what)
    _expect_zero_point(x_zero_point, x, "x_zero_point", what)
    _expect_zero_point(w_zero_point, w, "w_zero_point", what)
    for info, name in ((x_scale, "x_scale"), (x_zero_point, "x_zero_point"), (y_scale, "y_scale"),
                       (y_zero_point, "y_zero_point")):  # fmt: skip
        _expect_per_tensor(info, name, what)
    return [TensorInfo(conv_output_shape(desc, x, w, b, what), y_zero_point.dtype)]
