"""Remove layers that only pass their input on at inference: Identity and Dropout."""

from __future__ import annotations

from flowrt.engine.graph.graph import Graph

PASS_THROUGH_KINDS = ("Identity", "Dropout")


def remove_pass_through(graph: Graph) -> list[str]:
    """Reroute readers of each Identity/Dropout to its input and drop the layer.

    A Dropout whose mask output is read is kept: the mask is a real result.
    """
    changes = []
    for layer in graph:
        if layer.kind not in PASS_THROUGH_KINDS:
            continue
        if any(out.connections for out in layer.outputs[1:]):
            continue
        source = layer.inputs[0].source
        if source is None:
            continue
        graph.reroute(layer.outputs[0], source)
        graph.remove_layer(layer)
        changes.append(f"removed {layer.kind} {layer.name!r}")
    return changes
