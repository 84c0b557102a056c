"""Constant folding: evaluate, once, every layer whose inputs are all known before any run."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from flowrt.engine.graph.graph import Graph, Layer, constant_value
from flowrt.engine.graph.layers.io import ConstantDescriptor
from flowrt.types import TensorInfo

# evaluate(layer, input arrays) -> output arrays; the optimizer supplies one from a backend.
Evaluator = Callable[[Layer, Sequence["np.ndarray | None"]], Sequence[np.ndarray]]

# Layers whose output depends only on their input's shape, which may be known statically.
_SHAPE_ONLY_KINDS = ("Shape", "Size")


def _shape_stand_in(layer: Layer) -> list[np.ndarray | None] | None:
    """A zero-memory array of the input's static shape, for Shape/Size of a non-constant."""
    info = layer.input_infos[0]
    if info is None or not info.is_static:
        return None
    return [np.broadcast_to(np.zeros((), dtype=np.float32), info.shape)]  # type: ignore[arg-type]


def fold_constants(graph: Graph, evaluate: Evaluator) -> list[str]:
    """Replace foldable layers by Constant layers holding their outputs; return the changes.

    Shapes must be inferred before (Shape/Size fold from static input shapes).
    """
    folded = []
    for layer in graph.topological_order():
        if layer.kind in ("Input", "Output", "Constant"):
            continue
        if layer.kind in _SHAPE_ONLY_KINDS:
            inputs = _shape_stand_in(layer)
        else:
            sources = [slot.source for slot in layer.inputs]
            if not any(s is not None for s in sources):
                continue
            values = [constant_value(s) if s is not None else None for s in sources]
            if any(s is not None and v is None for s, v in zip(sources, values)):
                continue
            inputs = values
        if inputs is None:
            continue
        outputs = evaluate(layer, inputs)
        for out, value in zip(layer.outputs, outputs):
            if not out.connections:
                continue
            const = graph.add_layer(
                "Constant", ConstantDescriptor(value), name=f"{layer.name}/folded{out.index}"
            )
            const.outputs[0].info = TensorInfo.of(value)
            graph.reroute(out, const.outputs[0])
        graph.remove_layer(layer)
        folded.append(layer)
    graph.remove_unread_constants()
    if not folded:
        return []
    kinds = sorted({layer.kind for layer in folded})
    return [f"folded {len(folded)} constant layer(s) ({', '.join(kinds)})"]


# Rounds of folding after which a graph that still changes is left as it is (each round
# re-infers every shape; real exports settle in two or three).
MAX_ROUNDS = 8


def fold_to_fixpoint(graph: Graph, evaluate: Evaluator) -> list[str]:
    """Fold, re-infer shapes, and fold again while something folds: a layer folded in one
    round can make a shape static (a Pad whose pads were computed), and with it the Shape
    layers that read it, which the next round folds."""
    changes: list[str] = []
    for _ in range(MAX_ROUNDS):
        folded = fold_constants(graph, evaluate)
        if not folded:
            break
        changes += folded
        graph.infer_shapes()
    return changes
