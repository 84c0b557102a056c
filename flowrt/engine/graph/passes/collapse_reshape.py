"""Collapse chains of reshapes: Reshape, Flatten, Squeeze or Unsqueeze read only by a Reshape
or a Flatten is dropped, and the last becomes one Reshape to its (static) output shape."""

from __future__ import annotations

import numpy as np

from flowrt.engine.graph.graph import Graph, Layer
from flowrt.engine.graph.layers.reshape import ReshapeDescriptor
from flowrt.engine.graph.passes.fold_batch_norm import constant_slot

RESHAPING_KINDS = ("Reshape", "Flatten", "Squeeze", "Unsqueeze")


def _static_shape(layer: Layer) -> tuple[int, ...] | None:
    """The output shape when every dim is a known positive int (a 0 would read as 'copy')."""
    info = layer.outputs[0].info
    if info is None or info.shape is None:
        return None
    known = tuple(d for d in info.shape if isinstance(d, int) and d > 0)
    return known if len(known) == len(info.shape) else None


def _collapsible(first: Layer) -> Layer | None:
    """The Reshape or Flatten reading ``first``'s output alone, when both shapes are static."""
    if first.kind not in RESHAPING_KINDS:
        return None
    readers = first.outputs[0].connections
    if len(readers) != 1 or readers[0].index != 0:
        return None
    second = readers[0].layer
    if second.kind not in ("Reshape", "Flatten") or _static_shape(second) is None:
        return None
    return second if first.inputs[0].source is not None else None


def _collapse(graph: Graph, first: Layer, second: Layer) -> None:
    """Put one Reshape, named as ``second``, in the place of ``first`` and ``second``."""
    source, info = first.inputs[0].source, second.outputs[0].info
    target = np.array(_static_shape(second), dtype=np.int64)
    readers = list(second.outputs[0].connections)
    graph.remove_layer(second)
    graph.remove_layer(first)
    merged = graph.add_layer("Reshape", ReshapeDescriptor(), name=second.name, num_inputs=2)
    assert source is not None  # _collapsible found it
    source.connect(merged.inputs[0])
    constant_slot(graph, f"{merged.name}/shape", target).connect(merged.inputs[1])
    merged.outputs[0].info = info
    for destination in readers:
        merged.outputs[0].connect(destination)


def collapse_reshapes(graph: Graph) -> list[str]:
    """Replace each chain of reshapes ending in a Reshape or Flatten by one Reshape."""
    changes: list[str] = []
    changed = True
    while changed:  # a merged Reshape may start the next link of a longer chain
        changed = False
        for first in graph.topological_order():
            second = _collapsible(first) if graph.layers.get(first.name) is first else None
            if second is None:
                continue
            _collapse(graph, first, second)
            changes.append(
                f"collapsed {first.kind} {first.name!r} + {second.kind} {second.name!r} into one Reshape"
            )
            changed = True
    graph.remove_unread_constants()
    return changes
