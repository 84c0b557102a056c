"""Fuse an activation into the layer that produces its input, where that layer's backend can
apply it as it writes its output (Arm NN's fused Conv+Relu, ONNX Runtime's FusedConv).

A backend says which layer kinds take a fused activation through its capabilities:
``{"fused_activation": frozenset({"Conv", "Gemm", ...})}``. The pass runs after layers are
assigned, so both layers are on the same backend; the activation layer is removed and its
readers read the producer's output, which now carries ``layer.activation``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from flowrt.engine.graph.graph import Graph, Layer, constant_value
from flowrt.registry import ACTIVATION_KINDS, FusedActivation
from flowrt.types import DataType


def as_fused_activation(
    kind: str, descriptor: Any, constants: tuple[Any, ...] = ()
) -> FusedActivation | None:
    """The activation layer ``kind`` as a ``FusedActivation``; None when it cannot be one (a Clip
    whose bounds are not constants, a Gelu in its tanh form)."""
    if kind == "LeakyRelu":
        return FusedActivation("LeakyRelu", float(descriptor.alpha))
    if kind == "HardSigmoid":
        return FusedActivation(kind, float(descriptor.alpha), float(descriptor.beta))
    if kind in ("Swish", "Elu"):
        return FusedActivation(kind, float(descriptor.alpha))
    if kind == "Gelu":
        return FusedActivation(kind) if descriptor.approximate == "none" else None
    if kind == "Clip":
        bounds = list(constants[1:3]) + [None] * (3 - len(constants))
        if descriptor.opset < 11:
            bounds = [descriptor.min, descriptor.max]
        elif any(b is None for b in bounds[:2]) and len(constants) > 1:
            return None
        # .item(): a bound is one element, of shape () or (1,) alike (shape inference allows both)
        low, high = (
            np.inf * sign if b is None else float(np.asarray(b).item()) for b, sign in zip(bounds, (-1, 1))
        )
        return FusedActivation("Clip", low, high)
    return FusedActivation(kind)


def _fusable(layer: Layer, producer: Layer, capabilities: Mapping[str, Mapping[str, Any]]) -> bool:
    out = layer.inputs[0].source
    return (
        producer.backend == layer.backend
        and producer.activation is None
        and producer.kind in capabilities.get(producer.backend or "", {}).get("fused_activation", ())
        and len(producer.outputs) == 1
        and out is not None
        and len(out.connections) == 1
        and out.info is not None
        and out.info.dtype is DataType.FLOAT32
    )


def fuse_activations(graph: Graph, capabilities: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """Fold each activation into its producer where the producer's backend can apply it."""
    changes = []
    for layer in graph.topological_order():
        if layer.kind not in ACTIVATION_KINDS or layer.inputs[0].source is None:
            continue
        producer = layer.inputs[0].source.layer
        if not _fusable(layer, producer, capabilities):
            continue
        constants = tuple(constant_value(s.source) for s in layer.inputs)
        if any(s.source is not None and c is None for s, c in zip(layer.inputs[1:], constants[1:])):
            continue  # bounds computed at run time
        fused = as_fused_activation(layer.kind, layer.descriptor, constants)
        if fused is None:
            continue
        producer.activation = fused
        graph.reroute(layer.outputs[0], producer.outputs[0])
        graph.remove_layer(layer)
        changes.append(
            f"fused {layer.kind} {layer.name!r} into {producer.kind} {producer.name!r} on {producer.backend}"
        )
    return changes
