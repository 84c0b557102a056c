"""Fold chains of Transpose layers: Transpose(p2) after Transpose(p1) is one Transpose of the
composed permutation, or nothing at all when the two cancel (ONNX Runtime's
TransposeOptimizer does the same); a Transpose that keeps every dim in place is removed."""

from __future__ import annotations

from flowrt.engine.graph.graph import Graph, Layer
from flowrt.engine.graph.layers.transpose import TransposeDescriptor, transpose_perm


def _perm(layer: Layer) -> list[int] | None:
    info = layer.input_infos[0]
    if info is None or info.shape is None:
        return None
    return transpose_perm(layer.descriptor.perm, len(info.shape))


def _drop(graph: Graph, layer: Layer) -> None:
    """Remove ``layer``, its readers reading its input instead."""
    source = layer.inputs[0].source
    assert source is not None  # a Transpose's data input is always fed
    graph.reroute(layer.outputs[0], source)
    graph.remove_layer(layer)


def fold_transposes(graph: Graph) -> list[str]:
    """Compose each Transpose into the Transpose that is its only reader; drop identities."""
    changes = []
    for layer in graph.topological_order():
        if layer.kind != "Transpose" or layer.name not in graph.layers:
            continue
        perm = _perm(layer)
        if perm is None:
            continue
        readers = layer.outputs[0].connections
        if len(readers) == 1 and readers[0].layer.kind == "Transpose":
            second = readers[0].layer
            composed = [perm[p] for p in transpose_perm(second.descriptor.perm, len(perm))]
            _drop(graph, layer)
            second.descriptor = TransposeDescriptor(perm=tuple(composed))
            changes.append(f"folded Transpose {layer.name!r} into Transpose {second.name!r}")
        elif perm == sorted(perm):
            _drop(graph, layer)
            changes.append(f"removed Transpose {layer.name!r} (identity permutation)")
    return changes
