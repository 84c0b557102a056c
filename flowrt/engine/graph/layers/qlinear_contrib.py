"""ONNX Runtime's com.microsoft quantized operators that its QOperator format writes around
the float ones: QLinearGlobalAveragePool, QLinearAveragePool, QLinearSoftmax, QLinearSigmoid,
QLinearLeakyRelu and QLinearConcat.

Each reads 8-bit values (uint8 or int8) with a per-tensor scale and zero point and writes
values of the same type with its own: ``Y = quantize(op(dequantize(X)))``. The inputs and
attributes are ONNX Runtime's (``onnxruntime/core/graph/contrib_ops``), so that a model its
quantizer wrote imports as it is: X, X_scale, X_zero_point, Y_scale, Y_zero_point (Concat:
Y_scale, Y_zero_point, then a (tensor, scale, zero point) triple per input). Where ONNX
Runtime's schema makes a zero point optional, an absent one is 0 of X's type. How each is
computed, to ONNX Runtime's rounding, is the CpuRef kernels' module doc.
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs

from flowrt.engine.graph.layer_kind import NoDescriptor, as_tuple, layer_kind
from flowrt.engine.graph.layers.concat import ConcatDescriptor, infer_concat
from flowrt.engine.graph.layers.conv import auto_pad_field, non_negative_ints, positive_ints
from flowrt.engine.graph.layers.elementwise import expect_dtype
from flowrt.engine.graph.layers.pooling import pool_geometry
from flowrt.engine.graph.layers.quantize import _one_float32, _zero_of
from flowrt.engine.graph.layers.softmax import SoftmaxDescriptor
from flowrt.errors import DataTypeError, GraphError, ShapeError
from flowrt.types import DataType, Dim, TensorInfo

EIGHT_BIT_TYPES = frozenset({DataType.UINT8, DataType.INT8})
_flag = attrs.field(default=0, validator=attrs.validators.in_((0, 1)))


@attrs.frozen
class QLinearGlobalAveragePoolDescriptor:
    """QLinearGlobalAveragePool: the mean over every spatial cell of each channel. With
    ``channels_last`` the data is (N, spatial..., C), else (N, C, spatial...)."""

    channels_last: int = _flag


@attrs.frozen
class QLinearAveragePoolDescriptor:
    """QLinearAveragePool: AveragePool's windows (no dilations, as in ONNX Runtime) over data
    laid out (N, spatial..., C) with ``channels_last``, else (N, C, spatial...). With
    ``count_include_pad`` every window divides by the kernel's size, as ONNX Runtime's does."""

    kernel_shape: tuple[int, ...] = attrs.field(
        converter=as_tuple, validator=[attrs.validators.instance_of(tuple), positive_ints]
    )
    auto_pad: str = auto_pad_field()
    ceil_mode: int = _flag
    channels_last: int = _flag
    count_include_pad: int = _flag
    pads: tuple[int, ...] | None = attrs.field(default=None, converter=as_tuple, validator=non_negative_ints)
    strides: tuple[int, ...] | None = attrs.field(default=None, converter=as_tuple, validator=positive_ints)


@attrs.frozen
class QLinearLeakyReluDescriptor:
    """QLinearLeakyRelu: ``alpha * x`` below zero, ``x`` from zero on."""

    alpha: float = 0.01


@attrs.frozen
class QLinearSoftmaxDescriptor(SoftmaxDescriptor):
    """QLinearSoftmax: Softmax's attributes, ``axis`` and ``opset`` (the Softmax semantics it
    follows: before 13, the input seen as 2-D, rows by everything from ``axis`` on). Unlike
    Softmax's, ``axis`` defaults to -1 at every opset, as ONNX Runtime's schema has it. The
    importer fills ``opset`` from the model's ai.onnx opset, which is the value ONNX Runtime's
    quantizer writes into the attribute."""

    axis: int | None = -1


@attrs.frozen
class QLinearConcatDescriptor:
    """QLinearConcat: its inputs requantized to Y's scale and zero point, joined along ``axis``."""

    axis: int


def present(inputs: Sequence[TensorInfo | None], index: int, name: str, kind: str) -> TensorInfo:
    """Input ``index``'s info; GraphError naming it when that required input is absent."""
    info = inputs[index] if index < len(inputs) else None
    if info is None:
        raise GraphError(f"{kind}: input {index} ({name}) is required, but it is not connected")
    return info


def check_quantized(
    inputs: Sequence[TensorInfo | None], kind: str, *, y_zero_required: bool = False
) -> TensorInfo:
    """X's info, once X (uint8 or int8), X_scale, Y_scale (one float32 each) and the zero
    points (one value of X's type, where present) are checked: the five inputs of every kind
    here but Concat. DataTypeError or ShapeError naming the input that does not fit."""
    x = present(inputs, 0, "X", kind)
    expect_dtype(x, EIGHT_BIT_TYPES, f"{kind} input X")
    _one_float32(present(inputs, 1, "X_scale", kind), f"{kind} X_scale")
    _one_float32(present(inputs, 3, "Y_scale", kind), f"{kind} Y_scale")
    if y_zero_required:
        present(inputs, 4, "Y_zero_point", kind)
    for index, name in ((2, "X_zero_point"), (4, "Y_zero_point")):
        zero = inputs[index] if index < len(inputs) else None
        if zero is not None:
            _zero_of(zero, x, f"{kind} {name}")
    return x


def spatial_axes(rank: int, channels_last: int) -> range:
    """The spatial axes of data of ``rank``: after N, and before C when ``channels_last``."""
    return range(1, rank - 1) if channels_last else range(2, rank)


def _pooled(inputs, kind: str, channels_last: int) -> tuple[TensorInfo, tuple[Dim, ...] | None]:
    """A pool's checked data and its shape (None where unknown; ShapeError below rank 3)."""
    x = check_quantized(inputs, kind)
    if x.shape is None:
        return x, None
    if len(x.shape) < 3:
        layout = "(N, spatial..., C)" if channels_last else "(N, C, spatial...)"
        raise ShapeError(f"{kind} expects data of rank >= 3 {layout}, got shape {x.format_shape()}")
    return x, x.shape


@layer_kind("QLinearGlobalAveragePool", QLinearGlobalAveragePoolDescriptor, min_inputs=5, max_inputs=5)
def infer_qlinear_global_average_pool(desc: QLinearGlobalAveragePoolDescriptor, inputs, consts):
    x, shape = _pooled(inputs, "QLinearGlobalAveragePool", desc.channels_last)
    if shape is None:
        return [TensorInfo(None, x.dtype)]
    pooled = set(spatial_axes(len(shape), desc.channels_last))
    return [TensorInfo(tuple(1 if i in pooled else d for i, d in enumerate(shape)), x.dtype)]


@layer_kind("QLinearAveragePool", QLinearAveragePoolDescriptor, min_inputs=2, max_inputs=5)
def infer_qlinear_average_pool(desc: QLinearAveragePoolDescriptor, inputs, consts):
    x, shape = _pooled(inputs, "QLinearAveragePool", desc.channels_last)
    if shape is None:
        return [TensorInfo(None, x.dtype)]
    axes = spatial_axes(len(shape), desc.channels_last)
    if len(desc.kernel_shape) != len(axes):
        raise ShapeError(
            f"QLinearAveragePool kernel_shape {list(desc.kernel_shape)} needs {len(desc.kernel_shape)} "
            f"spatial dims, got data of shape {x.format_shape()}"
        )
    out = iter(pool_geometry(desc, [shape[i] for i in axes]).out)
    return [TensorInfo(tuple(next(out) if i in axes else d for i, d in enumerate(shape)), x.dtype)]


@layer_kind("QLinearSoftmax", QLinearSoftmaxDescriptor, min_inputs=2, max_inputs=5)
def infer_qlinear_softmax(desc: QLinearSoftmaxDescriptor, inputs, consts):
    x = check_quantized(inputs, "QLinearSoftmax", y_zero_required=True)
    if x.shape is not None:
        desc.resolved_axis(len(x.shape), "QLinearSoftmax")
    return [x]


def _infer_lookup(kind: str):
    """Shape inference of an elementwise kind: Y is X's shape and type."""

    def infer(desc, inputs, consts):
        return [check_quantized(inputs, kind)]

    return infer


layer_kind("QLinearSigmoid", NoDescriptor, min_inputs=2, max_inputs=5)(_infer_lookup("QLinearSigmoid"))
layer_kind("QLinearLeakyRelu", QLinearLeakyReluDescriptor, min_inputs=2, max_inputs=5)(
    _infer_lookup("QLinearLeakyRelu")
)


@layer_kind("QLinearConcat", QLinearConcatDescriptor, min_inputs=5, max_inputs=None)
def infer_qlinear_concat(desc: QLinearConcatDescriptor, inputs, consts):
    if (len(inputs) - 2) % 3:
        raise GraphError(
            "QLinearConcat: Y_scale, Y_zero_point, then a (tensor, scale, zero point) triple per "
            f"input expected, got {len(inputs)} inputs"
        )
    _one_float32(present(inputs, 0, "Y_scale", "QLinearConcat"), "QLinearConcat Y_scale")
    y_zero = present(inputs, 1, "Y_zero_point", "QLinearConcat")
    expect_dtype(y_zero, EIGHT_BIT_TYPES, "QLinearConcat Y_zero_point")
    tensors = []
    for start in range(2, len(inputs), 3):
        n = (start - 2) // 3
        x = present(inputs, start, f"input {n}", "QLinearConcat")
        if x.dtype != y_zero.dtype:
            raise DataTypeError(
                f"QLinearConcat: input {n} of Y's type {y_zero.dtype.name.lower()} expected, "
                f"got {x.dtype.name.lower()}"
            )
        scale = present(inputs, start + 1, f"input {n}'s scale", "QLinearConcat")
        _one_float32(scale, f"QLinearConcat input {n}'s scale")
        zero = present(inputs, start + 2, f"input {n}'s zero point", "QLinearConcat")
        _zero_of(zero, x, f"QLinearConcat input {n}")
        tensors.append(x)
    return infer_concat(ConcatDescriptor(axis=desc.axis), tensors, [None] * len(tensors))
