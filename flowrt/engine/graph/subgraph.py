"""SubgraphView: a set of layers of a graph, with the slots where data crosses its border."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

from flowrt.engine.graph.graph import Graph, InputSlot, Layer, OutputSlot


class SubgraphView:
    """A view of some layers of a graph (Arm NN's SubgraphView); it owns nothing.

    ``input_slots`` are the members' input slots fed from outside the view, ``output_slots``
    the members' output slots read outside it (or by nobody, for network outputs).
    ``options`` are the ``OptimizerOptions`` a backend's ``optimize_subgraph`` is asked under
    (Arm NN's model options; None outside the optimizer).
    """

    def __init__(self, graph: Graph, layers: Iterable[Layer], options: Any = None) -> None:
        self.graph = graph
        self.options = options
        names = {layer.name for layer in layers}
        self.layers = [layer for layer in graph.topological_order() if layer.name in names]
        self._names = names

    def __iter__(self) -> Iterator[Layer]:
        return iter(self.layers)

    def __len__(self) -> int:
        return len(self.layers)

    def __contains__(self, layer: Layer) -> bool:
        return layer.name in self._names

    @property
    def input_slots(self) -> list[InputSlot]:
        return [
            slot
            for layer in self.layers
            for slot in layer.inputs
            if slot.source is not None and slot.source.layer.name not in self._names
        ]

    @property
    def output_slots(self) -> list[OutputSlot]:
        return [
            out
            for layer in self.layers
            for out in layer.outputs
            if not out.connections or any(d.layer.name not in self._names for d in out.connections)
        ]

    def __repr__(self) -> str:
        return f"SubgraphView({[layer.name for layer in self.layers]})"


def connected_subgraphs(graph: Graph, layers: Iterable[Layer], options: Any = None) -> list[SubgraphView]:
    """Split ``layers`` into maximal groups connected through each other (Arm NN's subgraph selector)."""
    members = {layer.name: layer for layer in layers}
    seen: set[str] = set()
    groups: list[SubgraphView] = []
    for name, layer in members.items():
        if name in seen:
            continue
        stack, group = [layer], []
        seen.add(name)
        while stack:
            current = stack.pop()
            group.append(current)
            for other in [*current.producers(), *current.consumers()]:
                if other.name in members and other.name not in seen:
                    seen.add(other.name)
                    stack.append(other)
        groups.append(SubgraphView(graph, group, options))
    return groups
