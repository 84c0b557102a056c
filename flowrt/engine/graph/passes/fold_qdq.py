"""QDQ groups folded into quantized layers, as ONNX Runtime's QDQ selectors and actions do for
its CPU kernels.

A QDQ model (``onnxruntime.quantization.quantize_static``'s default format) keeps its float
operators and marks where values are quantized: each Conv or MatMul reads its input through a
DequantizeLinear, its constant weights through a DequantizeLinear of int8 values (and a Conv
its bias through one of int32 values), and its only reader is a QuantizeLinear. Run as
written, every such layer is a float product between two extra passes over its data. This
pass makes each group one quantized layer:

    Q(Conv(DQ(x), DQ(w), DQ(b)))  ->  QLinearConv(x, x_scale, x_zp, w, w_scale, w_zp, y_scale, y_zp, b')
    Q(MatMul(DQ(a), DQ(w)))       ->  QLinearMatMul(a, a_scale, a_zp, w, w_scale, w_zp, y_scale, y_zp)
    Q(Gemm(DQ(a), DQ(w), DQ(b)))  ->  QGemm(a, a_scale, a_zp, w, w_scale, w_zp, b', y_scale, y_zp)
                                      (ONNX Runtime's op: alpha and beta 1, transposes kept)
    Q(Reshape(DQ(x)))             ->  Reshape(x)      (Transpose, Flatten, Squeeze, Unsqueeze too,
                                                       and MaxPool of a positive scale)
    Q(Add(DQ(a), DQ(b)))          ->  QLinearAdd(a, a_scale, a_zp, b, b_scale, b_zp, y_scale, y_zp)
    Q(Add(DQ(a), c))              ->  QLinearAdd(a, a_scale, a_zp, c, 1, 0, y_scale, y_zp)   (Mul too)

with ``b' = round_half_even(DQ(b) / (x_scale * w_scale))`` in int32: the int32 bias itself when
it was quantized at that scale, as quantize_static does. The results are those of ONNX
Runtime's quantized kernels: integer products, requantized once, instead of float products of
dequantized values (they differ from the unfolded graph by a rounding step at most). A layer
that only moves values, between a DequantizeLinear and a QuantizeLinear of the same scale and
zero point, moves the quantized values themselves: exactly the same results. So does a
QLinearAdd or QLinearMul (``c`` a float32 constant): the group's steps in one pass, each as
its own kernel computes it.

Folded only where a group's parameters are per tensor (the weights' per output channel),
constant, without blocks, and where a backend of the preference list with integer kernels
(capability ``quantized_kernels``) takes the quantized layer: CpuRef runs these layers
exactly, in float64, slower than the float graph, so for CpuRef alone nothing is folded.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from flowrt.engine.graph.graph import Graph, Layer, OutputSlot, constant_value
from flowrt.engine.graph.layer_kind import NoDescriptor
from flowrt.engine.graph.layers.gemm import QGemmDescriptor
from flowrt.engine.graph.passes.fold_batch_norm import constant_slot
from flowrt.types import DataType, TensorInfo

# accepts(kind, descriptor, input infos, output infos) -> whether a backend runs the layer fast
Accepts = Callable[[str, Any, list[TensorInfo | None], list[TensorInfo | None]], bool]

_INT8 = ("uint8", "int8")


class _Dequantized:
    """A DequantizeLinear's quantized input and its constant parameters (zero point filled in)."""

    def __init__(self, layer: Layer, values: OutputSlot, scale: np.ndarray, zero: np.ndarray) -> None:
        self.layer, self.values, self.scale, self.zero = layer, values, scale, zero


def _dequantized(slot: OutputSlot | None, per_axis: int | None = None) -> _Dequantized | None:
    """The DequantizeLinear producing ``slot``, when its scale and zero point are constants per
    tensor, or (``per_axis`` given) per slice along that axis of its 4-D/2-D input."""
    if slot is None or slot.layer.kind != "DequantizeLinear" or slot.layer.activation is not None:
        return None
    dq = slot.layer
    desc = dq.descriptor
    if desc.block_size or desc.output_dtype or len(dq.inputs) < 2:
        return None
    values = dq.inputs[0].source
    scale = constant_value(dq.inputs[1].source)
    zero_slot = dq.inputs[2].source if len(dq.inputs) > 2 else None
    zero = constant_value(zero_slot)
    if values is None or values.info is None or scale is None or scale.dtype != np.float32:
        return None
    if zero_slot is not None and zero is None:
        return None
    if zero is None:
        zero = np.zeros(scale.shape, values.info.dtype.numpy)
    if scale.size != 1:
        rank = len(values.info.shape) if values.info.shape is not None else None
        if per_axis is None or rank is None or scale.ndim != 1 or desc.axis % rank != per_axis % rank:
            return None
    if zero.shape != scale.shape:
        return None
    return _Dequantized(dq, values, scale, zero)


def _quantizer(layer: Layer) -> Layer | None:
    """The QuantizeLinear that is ``layer``'s only reader, per tensor, to uint8 or int8."""
    out = layer.outputs[0]
    if len(layer.outputs) != 1 or len(out.connections) != 1:
        return None
    q = out.connections[0].layer
    if q.kind != "QuantizeLinear" or q.activation is not None or len(q.inputs) < 3:
        return None
    desc = q.descriptor
    if desc.block_size or desc.precision or not desc.saturate:
        return None
    scale, zero = constant_value(q.inputs[1].source), constant_value(q.inputs[2].source)
    if scale is None or zero is None or scale.size != 1 or zero.size != 1 or scale.dtype != np.float32:
        return None
    if zero.dtype.name not in _INT8 or q.outputs[0].info is None:
        return None
    return q


_NO_BIAS = np.zeros(0, np.int32)


def _bias(layer: Layer, x: _Dequantized, w: _Dequantized) -> np.ndarray | None:
    """The Conv's or Gemm's bias as int32 at scale ``x_scale * w_scale`` (empty when it has none); None
    when its bias is neither a constant nor dequantized from one."""
    slot = layer.inputs[2].source if len(layer.inputs) > 2 else None
    if slot is None:
        return _NO_BIAS
    value = constant_value(slot)
    if value is None:
        b = _dequantized(slot, per_axis=0)
        raw = constant_value(b.values) if b is not None else None
        if b is None or raw is None:
            return None
        value = (raw.astype(np.float64) - b.zero.astype(np.float64)) * b.scale.astype(np.float64)
    if value.dtype.kind not in "fiu" or value.ndim != 1:
        return None
    step = np.float64(x.scale.reshape(())) * w.scale.astype(np.float64).reshape(-1)
    bias = np.rint(value.astype(np.float64) / step)
    if not np.all(np.abs(bias) < 2**31):
        return None
    return bias.astype(np.int32)


def _group(layer: Layer) -> tuple[_Dequantized, _Dequantized, Layer] | None:
    """(input, weights, quantizer) of a Conv, MatMul or Gemm in a QDQ group, else None."""
    if layer.activation is not None or len(layer.inputs) < 2:
        return None
    if layer.kind == "Gemm" and (layer.descriptor.alpha != 1 or layer.descriptor.beta != 1):
        return None
    x = _dequantized(layer.inputs[0].source)
    # A Conv's weights per output channel (axis 0), a MatMul's per column (axis 1 of (K, N)),
    # a Gemm's per column of B' (axis 0 of B (N, K) with transB).
    transposed = layer.kind == "Gemm" and layer.descriptor.transB
    w = _dequantized(layer.inputs[1].source, per_axis=0 if layer.kind == "Conv" or transposed else 1)
    q = _quantizer(layer)
    if x is None or w is None or q is None or constant_value(w.values) is None:
        return None
    if (
        x.values.info is None
        or x.values.info.dtype not in (DataType.UINT8, DataType.INT8)
        or x.scale.size != 1
    ):
        return None
    if constant_value(w.values).dtype.name not in _INT8:  # type: ignore[union-attr]  # checked above
        return None
    if layer.kind != "Conv" and (w.values.info is None or len(w.values.info.shape or ()) != 2):
        return None
    return x, w, q


def _replace(
    graph: Graph,
    layer: Layer,
    q: Layer,
    made: tuple[str, Any, str],
    inputs: list[OutputSlot | None],
    dequantized: list[_Dequantized | None],
    accepts: Accepts,
) -> Layer | None:
    """``layer`` and its quantizer ``q`` replaced by one layer (``made``: kind, descriptor,
    name) reading ``inputs``, where ``accepts`` takes it; the DequantizeLinear layers of
    ``dequantized`` nothing else reads go too. None (the graph as it was, less the
    constants made for the question) where it does not."""
    kind, descriptor, name = made
    infos = [slot.info if slot is not None else None for slot in inputs]
    if not accepts(kind, descriptor, infos, [q.outputs[0].info]):
        graph.remove_unread_constants()  # the zero points, parameters and bias made for the question
        return None
    folded = graph.add_layer(kind, descriptor, name=name, num_inputs=len(inputs))
    for index, slot in enumerate(inputs):
        if slot is not None:  # None: an optional input left out (a QGemm's C, no bias)
            slot.connect(folded.inputs[index])
    folded.outputs[0].info = q.outputs[0].info
    graph.reroute(q.outputs[0], folded.outputs[0])
    for gone in (q, layer):
        graph.remove_layer(gone)
    for side in dequantized:
        if side is not None and side.layer.name in graph.layers and not side.layer.outputs[0].connections:
            graph.remove_layer(side.layer)
    return folded


_QUANTIZED = {"Conv": "QLinearConv", "MatMul": "QLinearMatMul", "Gemm": "QGemm"}


def _fold(graph: Graph, layer: Layer, accepts: Accepts) -> str | None:
    group = _group(layer)
    if group is None:
        return None
    x, w, q = group
    bias = _bias(layer, x, w) if layer.kind != "MatMul" else None
    if layer.kind != "MatMul" and bias is None:
        return None
    name = f"{layer.name}/quantized"
    inputs = [
        x.values,
        x.layer.inputs[1].source,
        x.layer.inputs[2].source if len(x.layer.inputs) > 2 and x.layer.inputs[2].source else None,
        w.values,
        w.layer.inputs[1].source,
        w.layer.inputs[2].source if len(w.layer.inputs) > 2 and w.layer.inputs[2].source else None,
        q.inputs[1].source,
        q.inputs[2].source,
    ]
    if inputs[2] is None:
        inputs[2] = constant_slot(graph, f"{name}/x_zero_point", x.zero)
    if inputs[5] is None:
        inputs[5] = constant_slot(graph, f"{name}/w_zero_point", w.zero)
    kind, descriptor = _QUANTIZED[layer.kind], layer.descriptor
    if kind == "QGemm":  # C before the output's parameters: absent, or an int32 bias
        inputs[6:6] = [constant_slot(graph, f"{name}/bias", bias) if bias is not None and bias.size else None]
        descriptor = QGemmDescriptor(transA=layer.descriptor.transA, transB=layer.descriptor.transB)
    elif bias is not None and bias.size:
        inputs.append(constant_slot(graph, f"{name}/bias", bias))
    if kind == "QLinearMatMul":
        descriptor = NoDescriptor()
    folded = _replace(graph, layer, q, (kind, descriptor, name), inputs, [x, w], accepts)
    if folded is None:
        return None
    if layer.kind != "MatMul" and len(layer.inputs) > 2:
        _remove_unread_dequantize(graph)
    return f"folded QDQ group of {layer.kind} {layer.name!r} into {kind} {folded.name!r}"


def _binary_operands(layer: Layer) -> tuple[_Dequantized, OutputSlot, _Dequantized | None] | None:
    """(A, B's slot, B dequantized or None for a float32 constant B) of an Add or Mul whose
    inputs are a per-tensor DequantizeLinear of 8-bit values of the output's shape (A) and
    another, or a float32 constant (B); None when it is not such a layer."""
    if layer.activation is not None or len(layer.inputs) != 2 or getattr(layer.descriptor, "legacy", False):
        return None
    out = layer.outputs[0].info
    slots = [slot.source for slot in layer.inputs]
    sides = [_dequantized(slot) for slot in slots]

    def quantized(side: _Dequantized | None) -> bool:
        info = side.values.info if side is not None else None
        return info is not None and info.dtype in (DataType.UINT8, DataType.INT8) and side.scale.size == 1  # type: ignore[union-attr]  # checked

    for a, b in ((0, 1), (1, 0)):  # Add and Mul commute: A is the side of the output's shape
        side_a, side_b, slot_b = sides[a], sides[b], slots[b]
        if not quantized(side_a) or out is None or side_a.values.info.shape != out.shape:  # type: ignore[union-attr]  # checked
            continue
        if quantized(side_b):
            return side_a, side_b.values, side_b  # type: ignore[return-value, union-attr]  # checked
        constant = constant_value(slot_b)
        if slot_b is not None and constant is not None and constant.dtype == np.float32:
            return side_a, slot_b, None  # type: ignore[return-value]  # checked
    return None


def _fold_binary(graph: Graph, layer: Layer, accepts: Accepts) -> str | None:
    """``Q(DQ(a) op DQ(b))`` or ``Q(DQ(a) op b)`` (b a float32 constant) -> QLinearAdd or QLinearMul."""
    q = _quantizer(layer)
    operands = _binary_operands(layer) if q is not None else None
    if q is None or operands is None:
        return None
    a, b_slot, b = operands
    name = f"{layer.name}/quantized"

    def params(side: _Dequantized, what: str) -> list[OutputSlot | None]:
        zero = side.layer.inputs[2].source if len(side.layer.inputs) > 2 else None
        return [
            side.layer.inputs[1].source,
            zero or constant_slot(graph, f"{name}/{what}_zero_point", side.zero),
        ]

    if b is not None:
        b_params = params(b, "b")
    else:  # a float32 B: as it is, (b - 0) * 1
        one, zero = np.ones((), np.float32), np.zeros((), np.float32)
        b_params = [
            constant_slot(graph, f"{name}/b_scale", one),
            constant_slot(graph, f"{name}/b_zero_point", zero),
        ]
    inputs = [a.values, *params(a, "a"), b_slot, *b_params, q.inputs[1].source, q.inputs[2].source]
    kind = "QLinearAdd" if layer.kind == "Add" else "QLinearMul"
    folded = _replace(graph, layer, q, (kind, NoDescriptor(), name), inputs, [a, b], accepts)
    if folded is None:
        return None
    return f"folded QDQ group of {layer.kind} {layer.name!r} into {kind} {folded.name!r}"


def _remove_unread_dequantize(graph: Graph) -> None:
    """DequantizeLinear layers of constants nothing reads any more (a folded Conv's bias)."""
    for dq in graph.of_kind("DequantizeLinear"):
        if not dq.outputs[0].connections and constant_value(dq.inputs[0].source) is not None:
            graph.remove_layer(dq)


# Layers that only move values: between a DequantizeLinear and a QuantizeLinear of the same
# scale and zero point, they move the quantized values themselves (ONNX Runtime's
# DropQDQNodesRules). MaxPool picks one of its values: with a positive scale, dequantizing
# keeps their order, so it picks the same one from the quantized values (``ORDERED``).
ORDERED = frozenset({"MaxPool"})
MOVERS = frozenset({"Reshape", "Transpose", "Flatten", "Squeeze", "Unsqueeze"}) | ORDERED


def _same_parameters(dq: Layer, q: Layer) -> bool:
    """Whether ``q`` quantizes with exactly the scale and zero point ``dq`` dequantizes with."""
    pairs = zip(dq.inputs[1:3], q.inputs[1:3], strict=True)
    values = [(constant_value(a.source), constant_value(b.source)) for a, b in pairs]
    return all(
        a is not None and b is not None and a.dtype == b.dtype and a.size == 1 and np.array_equal(a, b)
        for a, b in values
    )


def _drop(graph: Graph, mover: Layer, accepts: Accepts) -> str | None:
    """``Q(mover(DQ(x)))`` with one scale and zero point -> ``mover(x)``."""
    if mover.activation is not None or len(mover.outputs) != 1:
        return None
    dq_slot = mover.inputs[0].source
    if dq_slot is None or dq_slot.layer.kind != "DequantizeLinear" or len(dq_slot.connections) != 1:
        return None
    dq, q = dq_slot.layer, _quantizer(mover)
    if q is None or len(dq.inputs) < 3 or dq.descriptor.block_size or dq.descriptor.output_dtype:
        return None
    source = dq.inputs[0].source
    if source is None or source.info is None or not _same_parameters(dq, q):
        return None
    scale = constant_value(dq.inputs[1].source)
    if mover.kind in ORDERED and (scale is None or not np.all(scale > 0)):
        return None
    infos = [source.info, *(slot.source.info if slot.source else None for slot in mover.inputs[1:])]
    if not accepts(mover.kind, mover.descriptor, infos, [q.outputs[0].info]):
        return None
    dq_slot.disconnect(mover.inputs[0])
    source.connect(mover.inputs[0])
    mover.outputs[0].info = q.outputs[0].info
    graph.reroute(q.outputs[0], mover.outputs[0])
    graph.remove_layer(q)
    graph.remove_layer(dq)
    return (
        f"{mover.kind} {mover.name!r} moves quantized values: its DequantizeLinear and QuantizeLinear dropped"
    )


def fold_qdq(graph: Graph, accepts: Accepts) -> list[str]:
    """Fold each QDQ group of a Conv or MatMul that ``accepts`` takes as its quantized layer
    (see the module doc); return the changes."""
    if not graph.of_kind("QuantizeLinear"):
        return []
    graph.infer_shapes()  # the groups are recognized by their tensors' types
    changes = []
    for layer in graph.topological_order():
        if layer.name not in graph.layers:
            continue
        if layer.kind in _QUANTIZED:
            change = _fold(graph, layer, accepts)
        elif layer.kind in MOVERS:
            change = _drop(graph, layer, accepts)
        else:
            continue
        if change is not None:
            changes.append(change)
    if changes:
        graph.remove_unread_constants()
    return changes


def fold_qdq_binaries(graph: Graph, accepts: Accepts) -> list[str]:
    """Fold each QDQ group of an Add or Mul into a QLinearAdd or QLinearMul that ``accepts``
    takes (see the module doc); return the changes. After constant folding: a constant
    operand is a float32 constant by then, and the shapes are known."""
    if not graph.of_kind("QuantizeLinear"):
        return []
    changes = []
    for layer in graph.topological_order():
        if layer.name in graph.layers and layer.kind in ("Add", "Mul"):
            change = _fold_binary(graph, layer, accepts)
            if change is not None:
                changes.append(change)
    if changes:
        graph.remove_unread_constants()
    return changes
