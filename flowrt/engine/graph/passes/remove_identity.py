"""Remove layers that only pass their input on at inference: Identity, Dropout, and a Cast to
the type its input already has (exporters write them around mixed-precision code)."""

from __future__ import annotations

from flowrt.engine.graph.graph import Graph, Layer

PASS_THROUGH_KINDS = ("Identity", "Dropout")


def _mode_unknown(layer: Layer) -> bool:
    """Whether ``layer`` is a Dropout whose ``training_mode`` is not a constant (an input of
    the graph): its kernel refuses a true one when it runs, so it must stay to run."""
    if layer.kind != "Dropout" or len(layer.inputs) < 3 or layer.inputs[2].source is None:
        return False
    return layer.inputs[2].source.layer.kind != "Constant"


def _same_type_cast(layer: Layer) -> bool:
    """Whether ``layer`` is a Cast to the type its input has (the types known)."""
    if layer.kind != "Cast" or layer.inputs[0].source is None:
        return False
    before, after = layer.inputs[0].source.info, layer.outputs[0].info
    return before is not None and after is not None and before.dtype == after.dtype


def remove_pass_through(graph: Graph) -> list[str]:
    """Reroute readers of each Identity/Dropout, and of each Cast to its input's own type, to
    its input and drop the layer.

    A Dropout whose mask output is read is kept: the mask is a real result. So is one whose
    ``training_mode`` is not a constant: a true one must fail the run, not be skipped.
    """
    changes = []
    for layer in graph:
        if not (layer.kind in PASS_THROUGH_KINDS or _same_type_cast(layer)) or _mode_unknown(layer):
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
