"""Constant folding: evaluate, once, every layer whose inputs are all known before any run.

What folding makes is held by the network from then on, so it is held to the memory budget
(``OptimizerOptions.memory_budget``) before it is made: a layer whose outputs' inferred shapes
would take the budget past its limit, with the constants the graph already holds, raises
ResourceError naming the layer (a 100-byte model's ConstantOfShape can ask for terabytes).
A layer that cannot run on its constant inputs (a Gather of an index past the end) raises
GraphError naming it: it would fail in every run.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from flowrt.engine.graph.graph import Graph, Layer, constant_value
from flowrt.engine.graph.layers.io import ConstantDescriptor
from flowrt.engine.graph.layers.subgraph_body import subgraphs_of
from flowrt.engine.memory.budget import MemoryBudget, tensor_bytes
from flowrt.errors import FlowrtError, GraphError
from flowrt.types import TensorInfo, static_dims

# evaluate(layer, input arrays) -> output arrays; the optimizer supplies one from a backend.
Evaluator = Callable[[Layer, Sequence["np.ndarray | None"]], Sequence[np.ndarray]]

BUDGET_OPTION = "OptimizerOptions(memory_budget=...)"

# Layers whose output depends only on their input's shape, which may be known statically.
_SHAPE_ONLY_KINDS = ("Shape", "Size")


def _shape_stand_in(layer: Layer) -> list[np.ndarray | None] | None:
    """A zero-memory array of the input's static shape, for Shape/Size of a non-constant."""
    info = layer.input_infos[0]
    if info is None or not info.is_static:
        return None
    try:
        return [np.broadcast_to(np.zeros((), dtype=np.float32), static_dims(info.shape))]
    except ValueError:  # more elements than numpy can index: no array has this shape, none is fed one
        return None


def _constant_bytes(graph: Graph) -> int:
    """The bytes the graph's Constant layers hold."""
    return sum(layer.descriptor.value.nbytes for layer in graph.of_kind("Constant"))


def _planned_bytes(layer: Layer) -> int | None:
    """The bytes of the layer's read outputs, from their inferred infos; None when one is not static."""
    total = 0
    for out in layer.outputs:
        if not out.connections:
            continue
        if out.info is None or not out.info.is_static:
            return None
        total += tensor_bytes(static_dims(out.info.shape), out.info.dtype.itemsize)
    return total


def _evaluate(layer: Layer, inputs: list, evaluate: Evaluator, budget: MemoryBudget) -> Sequence[np.ndarray]:
    """The layer's outputs, claimed from ``budget`` before they are made (after, when their
    shapes are known only then: a NonZero's, bounded by its input)."""
    what = f"constant folding of layer {layer.name!r} ({layer.kind})"
    planned = _planned_bytes(layer)
    if planned is not None:
        budget.claim(planned, what)
    try:
        outputs = evaluate(layer, inputs)
    except FlowrtError:
        raise
    except MemoryError as e:
        raise budget.out_of_memory(e, what) from e
    except Exception as e:  # the layer cannot run on its constant inputs: it never could
        raise GraphError(
            f"{what} failed: the layer cannot run on its constant inputs: {type(e).__name__}: {e}"
        ) from e
    if planned is None:
        budget.claim(sum(np.asarray(o).nbytes for o in outputs), what)
    return outputs


def fold_constants(graph: Graph, evaluate: Evaluator, budget: MemoryBudget | None = None) -> list[str]:
    """Replace foldable layers by Constant layers holding their outputs; return the changes.

    Shapes must be inferred before (Shape/Size fold from static input shapes). Each layer's
    outputs are inferred again as the pass reaches it, so that a shape made static by a fold
    earlier in the pass (a Pad whose pads were computed) lets the Shape layers that read it
    fold in the same pass, and every shape is up to date when it ends. ``budget`` (default:
    the default memory budget, counting the constants the graph holds) is claimed before
    each layer is evaluated.
    """
    if budget is None:
        budget = MemoryBudget(None, BUDGET_OPTION, _constant_bytes(graph), "the network's constants")
    folded = []
    for layer in graph.topological_order():
        # A layer with subgraphs (If, Loop, Scan) runs them as nested dataflows, which only a
        # load compiles: it runs with the network, whatever its inputs.
        if layer.kind in ("Input", "Constant"):
            continue
        graph.infer_layer(layer)
        if layer.kind == "Output" or subgraphs_of(layer.descriptor):
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
        outputs = _evaluate(layer, inputs, evaluate, budget)
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
# infers every shape as it goes; real exports settle in one, the next finding nothing more).
MAX_ROUNDS = 8


def fold_to_fixpoint(graph: Graph, evaluate: Evaluator, memory_budget: int | None = None) -> list[str]:
    """Fold while something folds: a layer folded can make a shape static (a Pad whose pads
    were computed), and with it the Shape layers that read it. Each round infers shapes as it
    goes, so a chain of them (Swin's blocks, each padded by its input's shape) folds in one
    round, and the next finds what is left. Each round holds the graph's constants and what
    it folds to ``memory_budget`` (bytes; None: the default budget)."""
    changes: list[str] = []
    for _ in range(MAX_ROUNDS):
        budget = MemoryBudget(memory_budget, BUDGET_OPTION, _constant_bytes(graph), "the network's constants")
        folded = fold_constants(graph, evaluate, budget)
        if not folded:
            break
        changes += folded
    return changes
