"""Fold an inference BatchNormalization into the convolution that feeds it.

y = scale * (conv(x, W) + b - mean) / sqrt(var + eps) + B
  = conv(x, W * f) + (b - mean) * f + B,   with f = scale / sqrt(var + eps) per output channel.
"""

from __future__ import annotations

import numpy as np

from flowrt.engine.graph.graph import Graph, Layer, OutputSlot, constant_value
from flowrt.engine.graph.layers.io import ConstantDescriptor
from flowrt.types import TensorInfo


def _foldable(bn: Layer) -> tuple[Layer, list[np.ndarray]] | None:
    source = bn.inputs[0].source
    if source is None or source.layer.kind != "Conv" or len(source.connections) != 1:
        return None
    if any(out.connections for out in bn.outputs[1:]):
        return None
    desc = bn.descriptor
    if getattr(desc, "spatial", 1) != 1 or getattr(desc, "training_mode", 0):
        return None
    params = [constant_value(slot.source) for slot in bn.inputs[1:5]]
    conv = source.layer
    weights = constant_value(conv.inputs[1].source)
    bias_slot = conv.inputs[2].source if len(conv.inputs) > 2 else None
    if any(p is None for p in params) or weights is None or weights.dtype.kind != "f":
        return None
    if bias_slot is not None and constant_value(bias_slot) is None:
        return None
    return conv, [weights, *params]  # type: ignore[list-item]


def constant_slot(graph: Graph, name: str, value: np.ndarray) -> OutputSlot:
    """The output of a new Constant layer holding ``value`` (its info set)."""
    layer = graph.add_layer("Constant", ConstantDescriptor(value), name=name)
    layer.outputs[0].info = TensorInfo.of(value)
    return layer.outputs[0]


def fold_batch_norm(graph: Graph) -> list[str]:
    """Fold each BatchNormalization that directly follows a constant-weight Conv; return the changes."""
    changes = []
    for bn in graph.of_kind("BatchNormalization"):
        match = _foldable(bn)
        if match is None:
            continue
        conv, (weights, scale, shift, mean, var) = match
        eps = float(getattr(bn.descriptor, "epsilon", 1e-5))
        factor = scale.astype(np.float64) / np.sqrt(var.astype(np.float64) + eps)
        old_bias = (
            constant_value(conv.inputs[2].source) if len(conv.inputs) > 2 and conv.inputs[2].source else None
        )
        bias = np.zeros(weights.shape[0]) if old_bias is None else old_bias.astype(np.float64)
        new_w = (weights * factor.reshape(-1, *[1] * (weights.ndim - 1))).astype(weights.dtype)
        new_b = ((bias - mean) * factor + shift).astype(weights.dtype)
        conv.inputs[1].source.disconnect(conv.inputs[1])  # type: ignore[union-attr]
        constant_slot(graph, f"{conv.name}/weights_bn", new_w).connect(conv.inputs[1])
        conv.ensure_inputs(3)
        if conv.inputs[2].source is not None:
            conv.inputs[2].source.disconnect(conv.inputs[2])
        constant_slot(graph, f"{conv.name}/bias_bn", new_b).connect(conv.inputs[2])
        graph.reroute(bn.outputs[0], conv.outputs[0])
        graph.remove_layer(bn)
        changes.append(f"folded BatchNormalization {bn.name!r} into Conv {conv.name!r}")
    graph.remove_unread_constants()
    return changes
