"""Batching rules of the quantized layers: QuantizeLinear and DequantizeLinear, ONNX's
QOperator layers (QLinearConv, QLinearMatMul, ConvInteger, MatMulInteger) and ONNX Runtime's
com.microsoft ones (QGemm, QLinearAdd, QLinearMul, the quantized pools, curves, Softmax and
Concat), which the QDQ fold (``fold_qdq``) makes of a QDQ model for CpuAcc. Without them a
quantized network was never re-batched: a batching stream ran it one request at a time.

A quantized layer computes each sample as its float twin does, with quantization parameters
(scales, zero points) that are constants of the layer: each rule is its twin's, the
parameters checked not to carry the batch and, where they belong to the batched input, to
be one value for the whole tensor (a scale per row of A would have as many rows as the
samples). DynamicQuantizeLinear is refused: its scale is computed over the whole tensor, so
each sample's values would set the others'.
"""

from __future__ import annotations

import math

from flowrt.engine.graph.graph import Layer
from flowrt.engine.graph.passes.batch_rules import (
    Axes,
    Axis,
    Carried,
    Refused,
    Rewrite,
    batch_rule,
    batched_first,
    broadcasting,
    input_shape,
    only_batched,
    softmax,
)
from flowrt.engine.graph.shapes import normalize_axis


def _size(layer: Layer, index: int) -> int | None:
    """How many values input ``index`` holds (None where its shape is not all numbers)."""
    shape = input_shape(layer, index)
    return math.prod(shape) if all(isinstance(d, int) for d in shape) else None  # type: ignore[arg-type]


def _per_tensor(layer: Layer, indices: tuple[int, ...], batch: int, what: str) -> None:
    """The parameters at ``indices`` (those of the batched input) hold one value each."""
    for i in indices:
        if i >= len(layer.inputs) or layer.inputs[i].source is None:
            continue
        size = _size(layer, i)
        if size != 1:
            raise Refused(
                f"input {i} ({what}'s quantization) holds {size} values; one per tensor is expected "
                f"with the batch on axis {batch}"
            )


@batch_rule("QuantizeLinear", "DequantizeLinear")
def quantize(layer: Layer, axes: list[Axis]) -> Axis:
    """Element by element: a scale per tensor, or per slice along an axis other than the
    batch's; blocked scales (one per block along an axis, of the input's rank) refused."""
    batch = batched_first(axes)
    present = [i for i in (1, 2) if i < len(layer.inputs) and layer.inputs[i].source is not None]
    if all(_size(layer, i) == 1 and len(input_shape(layer, i)) <= 1 for i in present):
        return batch
    if getattr(layer.descriptor, "block_size", 0):
        raise Refused("its scales are per block, of the input's rank: they would carry the batch")
    along = normalize_axis(layer.descriptor.axis, len(input_shape(layer, 0)), layer.kind)
    if along == batch:
        raise Refused(f"its scales are per slice along axis {along}, which carries the batch")
    return batch


@batch_rule("DynamicQuantizeLinear")
def dynamic_quantize(layer: Layer, axes: list[Axis]) -> Axis:
    raise Refused(
        "its scale and zero point are computed over the whole tensor, every sample's values with the others'"
    )


@batch_rule("QLinearConv", "ConvInteger", "QLinearAveragePool", "QLinearGlobalAveragePool")
def quantized_per_sample(layer: Layer, axes: list[Axis]) -> Axis:
    """As Conv and the pools: each sample on its own with the batch on axis 0 of X."""
    return batched_first(axes, at=0)


@batch_rule("QLinearLeakyRelu", "QLinearSigmoid")
def quantized_per_element(layer: Layer, axes: list[Axis]) -> Axis:
    """Element by element, X's parameters per tensor (as the layers take them)."""
    return batched_first(axes)


@batch_rule("QLinearSoftmax")
def quantized_softmax(layer: Layer, axes: list[Axis]) -> Carried | Axes | Rewrite:
    """As Softmax (its descriptor is Softmax's)."""
    return softmax(layer, axes)


@batch_rule("QLinearAdd", "QLinearMul")
def quantized_broadcasting(layer: Layer, axes: list[Axis]) -> Carried | Axes | Rewrite:
    """As Add and Mul between A (input 0) and B (input 3); the parameters are scalars."""
    return broadcasting(layer, axes)


def _product(layer: Layer, axes: list[Axis], a: int, b: int, a_parameters: tuple[int, ...]) -> Axis:
    """A matrix product of A (input ``a``, which carries the batch, on a row or broadcast
    axis, never the one contracted) by B (input ``b``, which does not); with the batch on A's
    rows, A's parameters per tensor."""
    batch = batched_first(axes)
    a_shape, b_shape = input_shape(layer, a), input_shape(layer, b)
    if len(a_shape) < 2 or batch == len(a_shape) - 1:
        raise Refused("the batch is on the axis it contracts")
    rank = max(len(a_shape), len(b_shape))
    at = batch + rank - len(a_shape) - (rank - len(b_shape))  # the batch axis in B's dims
    if len(b_shape) > 2 and 0 <= at < len(b_shape) - 2 and b_shape[at] != 1:
        raise Refused(f"input {b} has {b_shape[at]} on the batch axis; 1 is expected, so that it broadcasts")
    if batch == len(a_shape) - 2:  # on A's rows: a parameter per row would not have N samples' rows
        _per_tensor(layer, a_parameters, batch, f"input {a}")
    return batch


@batch_rule("QLinearMatMul")
def qlinear_matmul(layer: Layer, axes: list[Axis]) -> Axis:
    """A (0) by B (3): A's and Y's scales and zero points (1, 2, 6, 7) per tensor with the batch
    on A's rows."""
    return _product(layer, axes, 0, 3, (1, 2, 6, 7))


@batch_rule("MatMulInteger")
def matmul_integer(layer: Layer, axes: list[Axis]) -> Axis:
    """A (0) by B (1): A's zero point (2) per tensor with the batch on A's rows."""
    return _product(layer, axes, 0, 1, (2,))


@batch_rule("QGemm")
def qgemm(layer: Layer, axes: list[Axis]) -> Axis:
    """As Gemm, the batch on A's rows: A's and Y's parameters (1, 2, 7, 8) per tensor, C (6)
    one row or none."""
    rows = 1 if layer.descriptor.transA else 0
    batch = batched_first(axes, at=rows)
    if len(layer.inputs) > 6 and layer.inputs[6].source is not None:
        c = input_shape(layer, 6)
        if len(c) == 2 and c[0] != 1:
            raise Refused(f"its C input {c} has {c[0]} rows; 1 is expected, so that it broadcasts")
    _per_tensor(layer, (1, 2, 7, 8), batch, "A or Y")
    return 0


@batch_rule("QLinearConcat")
def qlinear_concat(layer: Layer, axes: list[Axis]) -> Axis:
    """As Concat: the joined inputs (X at 2, 5, 8...) carry the batch on one axis, not the one
    joined along, and their parameters do not."""
    data = list(range(2, len(layer.inputs), 3))
    batched = {axes[i] for i in data}
    if len(batched) != 1 or None in batched:
        raise Refused(f"every joined input must carry the batch on one axis, found {[axes[i] for i in data]}")
    only_batched(axes, *data)
    batch = batched.pop()
    assert batch is not None  # None was refused above
    along = normalize_axis(layer.descriptor.axis, len(input_shape(layer, 2)), layer.kind)
    if batch == along:
        raise Refused(f"it joins along axis {along}, which carries the batch")
    return batch
