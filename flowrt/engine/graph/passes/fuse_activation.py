"""Fuse an activation into the layer that produces its input, where that layer's backend can
apply it as it writes its output (Arm NN's fused Conv+Relu, ONNX Runtime's FusedConv).

A backend says which layer kinds take a fused activation through its capabilities:
``{"fused_activation": frozenset({"Conv", "Gemm", ...})}``; it then applies every activation
the activation table marks fused "everywhere" (``activation_kinds("everywhere")``). The pass
runs after layers are assigned, so both layers are on the same backend; the activation layer
is removed and its readers read the producer's output, which now carries ``layer.activation``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from flowrt.engine.graph.graph import Graph, Layer, constant_value
from flowrt.engine.graph.layer_kind import activation_facts, activation_kinds
from flowrt.registry import FusedActivation
from flowrt.types import DataType


def as_fused_activation(kind: str, descriptor: Any, constants: Sequence[Any] = ()) -> FusedActivation | None:
    """The activation layer ``kind`` as a ``FusedActivation``, its parameters as its fact in the
    activation table reads them from ``descriptor`` and the layer's ``constants`` (one value or
    None per input), in its form (Gelu's tanh one); None when it cannot be one (no activation
    that is fused, a Clip whose bounds are not constants)."""
    fact = activation_facts().get(kind)
    if fact is None or fact.fused == "never":
        return None
    params = fact.params(descriptor, constants)
    return None if params is None else FusedActivation(kind, *params, form=fact.form(descriptor))


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
    kinds = activation_kinds("everywhere")
    for layer in graph.topological_order():
        if layer.kind not in kinds or layer.inputs[0].source is None:
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
