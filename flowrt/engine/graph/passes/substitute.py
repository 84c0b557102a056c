"""Apply a backend's substitutions: a subgraph of its layers replaced by its own fused layer.

As Arm NN's ``SubstituteSubgraph``: the replaced layers leave the graph; the replacement
reads what the subgraph read from outside and is read by what read the subgraph's outputs.
Each substitution is checked before it is applied (its layers are the backend's and in the
view it was handed, its outputs match the ones it replaces, the backend supports it) and
refused with a BackendError naming the backend and the layers otherwise.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import attrs

from flowrt.engine.graph.graph import Graph, Layer, OutputSlot, constant_value
from flowrt.engine.graph.layer_kind import get_layer_kind
from flowrt.engine.graph.subgraph import SubgraphView
from flowrt.errors import BackendError
from flowrt.registry import LayerSupport, OptimizationViews, ReplacementLayer


@attrs.frozen
class SubstitutionRecord:
    """One applied substitution: which layers a backend replaced, and by which layer."""

    backend: str
    replaced: tuple[str, ...]
    replaced_kinds: tuple[str, ...]
    layer: str
    kind: str
    activation: str | None = None

    def describe(self) -> str:
        parts = " + ".join(f"{k} {n!r}" for k, n in zip(self.replaced_kinds, self.replaced))
        fused = f" (+{self.activation})" if self.activation else ""
        return f"{self.backend}: {parts} -> {self.kind} {self.layer!r}{fused}"


def _names(subgraph: Iterable[Any]) -> list[str]:
    return [layer.name for layer in subgraph]


def check_coverage(bid: str, view: SubgraphView, views: OptimizationViews) -> None:
    """BackendError unless every layer of ``view`` is in exactly one list of ``views``."""
    listed = [
        *(n for s in views.substitutions for n in _names(s.subgraph)),
        *(n for sub in views.failed for n in _names(sub)),
        *(n for sub in views.untouched for n in _names(sub)),
    ]
    expected = sorted(layer.name for layer in view)
    if sorted(listed) != expected:
        twice = sorted({n for n in listed if listed.count(n) > 1})
        missing = sorted(set(expected) - set(listed))
        stray = sorted(set(listed) - set(expected))
        raise BackendError(
            f"backend {bid}'s optimize_subgraph must put each layer of {view} in exactly one of "
            f"substitutions, failed or untouched; found missing {missing}, listed twice {twice}, "
            f"not in the subgraph {stray}"
        )


def _outputs_of(replacement: ReplacementLayer, graph: Graph, members: set[str], where: str) -> list[Any]:
    """The replacement's output infos, inferred from its inputs (which must lie outside)."""
    for slot in replacement.inputs:
        if slot is not None and (slot.layer.name in members or slot.layer.name not in graph.layers):
            raise BackendError(f"{where}: input {slot} must be produced outside the replaced layers")
    try:
        spec = get_layer_kind(replacement.kind)
    except KeyError:
        raise BackendError(f"{where}: unknown layer kind {replacement.kind!r}") from None
    infos = [slot.info if slot is not None else None for slot in replacement.inputs]
    consts = [constant_value(slot) for slot in replacement.inputs]
    try:
        return spec.infer(replacement.descriptor, infos, consts)
    except Exception as e:
        raise BackendError(f"{where}: cannot infer the replacement's outputs: {e}") from e


def substitute(
    graph: Graph,
    bid: str,
    subgraph: Iterable[Any],
    replacement: ReplacementLayer,
    support: LayerSupport,
    moved: dict[OutputSlot, OutputSlot],
) -> tuple[Layer, SubstitutionRecord]:
    """Replace ``subgraph``'s layers (all on ``bid``) by ``replacement``; return the new layer.

    ``moved`` maps the output slots of layers replaced so far to the slots that took their
    place: a backend answers for a whole view at once, so a later substitution may name an
    input that an earlier one replaced. This one's replaced outputs are added to it.
    """
    subgraph = list(subgraph)
    replacement = attrs.evolve(replacement, inputs=tuple(moved.get(s, s) for s in replacement.inputs))
    found_layers = [graph.layers.get(name) for name in _names(subgraph)]
    if any(found is not given for found, given in zip(found_layers, subgraph)):
        raise BackendError(
            f"backend {bid}'s substitution of {_names(subgraph)}: a layer is no longer in the graph"
        )
    where = f"backend {bid}'s substitution of {_names(subgraph)}"
    layers = [layer for layer in found_layers if layer is not None]
    if not layers or len(layers) < len(found_layers) or any(layer.backend != bid for layer in layers):
        raise BackendError(f"{where}: every replaced layer must be a layer of the graph assigned to {bid}")
    view = SubgraphView(graph, layers)
    members = {layer.name for layer in view}
    outputs = view.output_slots
    infos = _outputs_of(replacement, graph, members, where)
    found = [info for info in infos[: len(outputs)]]
    expected = [out.info for out in outputs]
    if found != expected:
        raise BackendError(f"{where}: the replacement's outputs are {found}, the replaced ones {expected}")
    answer = support.is_layer_supported(
        replacement.kind, replacement.descriptor, [s.info if s else None for s in replacement.inputs], found
    )
    if not answer.supported:
        raise BackendError(f"{where}: {bid} does not support its own {replacement.kind}: {answer.reason}")
    readers = [list(out.connections) for out in outputs]
    record = SubstitutionRecord(
        bid,
        tuple(layer.name for layer in view),
        tuple(layer.kind for layer in view),
        replacement.name or view.layers[0].name,
        replacement.kind,
        " ".join(filter(None, (replacement.activation.kind, replacement.activation.form)))
        if replacement.activation
        else None,
    )
    for layer in view:
        graph.remove_layer(layer)
    new = graph.add_layer(
        replacement.kind, replacement.descriptor, record.layer, len(replacement.inputs), len(outputs)
    )
    new.backend, new.activation = bid, replacement.activation
    for slot, source in zip(new.inputs, replacement.inputs):
        if source is not None:
            source.connect(slot)
    for old, out, info, destinations in zip(outputs, new.outputs, found, readers):
        moved[old] = out
        out.info = info
        for destination in destinations:
            out.connect(destination)
    return new, attrs.evolve(record, layer=new.name)
