"""Re-batching: a network exported for a batch of 1, re-shaped to run N samples at once.

As OpenVINO's ``ov.set_batch``: every input's leading dim becomes N and shape inference runs
again; constants (weights) are shared with the original graph, never copied. Exporters often
hard-code the batch of 1 in Reshape targets (``[1, 9216]``), so the pass first proves, layer by
layer, which axis of each tensor carries the samples (``batch_rules``); a Reshape target whose
leading 1 is provably the batch is rewritten to N. Where the proof fails the pass refuses with
a ShapeError naming the layer and the reason: samples that could mix are never re-batched.

What is proven is that output ``i`` of the re-batched graph equals the output of the graph as
given (at batch 1) on sample ``i`` of each input; outputs carry the batch on axis 0.
"""

from __future__ import annotations

import copy
from typing import cast, overload

import attrs

from flowrt.engine.graph.graph import Graph, OutputSlot
from flowrt.engine.graph.network import Network
from flowrt.engine.graph.optimizer import OptimizedNetwork
from flowrt.engine.graph.passes import (  # noqa: F401 (register their rules)
    batch_rules_gather,
    batch_rules_more,
    batch_rules_quantized,
    batch_rules_reshape,
)
from flowrt.engine.graph.passes.batch_rules import (
    RULES,
    TAKES_INTERLEAVED,
    Axis,
    Carried,
    Interleaved,
    Refused,
    Rewrite,
    check_output,
)
from flowrt.errors import ShapeError, UnsupportedLayerError
from flowrt.registry import BackendRegistry, backend_registry


def prove_batch_axes(graph: Graph) -> tuple[dict[OutputSlot, Carried], list[Rewrite]]:
    """Per output slot, the axis that carries the batch (None: independent of the inputs), and
    the rewrites re-batching needs. Shapes must be inferred at batch 1; every input is batched
    on axis 0. Raises ShapeError naming the first layer that could mix samples."""
    axes: dict[OutputSlot, Carried] = {}
    rewrites: list[Rewrite] = []
    for layer in graph.topological_order():
        inputs = [axes.get(s.source) if s.source is not None else None for s in layer.inputs]
        if layer.kind == "Output":
            info = layer.input_infos[0]
            check_output(layer.descriptor.name, inputs[0], None if info is None else info.shape)
            continue
        if layer.kind == "Input":
            out: Carried | tuple[Axis, ...] = 0
        elif all(a is None for a in inputs):
            out = None
        else:
            try:
                rule = RULES.get(layer.kind)
                if rule is None:
                    raise Refused(f"flowrt has no batching rule for {layer.kind} layers")
                woven = [a for a in inputs if isinstance(a, Interleaved)]
                if woven and layer.kind not in TAKES_INTERLEAVED:
                    raise Refused(
                        f"an input carries the batch interleaved with other rows on axis "
                        f"{woven[0].axis}, which only row-wise layers and Reshape take"
                    )
                # only the rules of TAKES_INTERLEAVED see an Interleaved (refused above)
                result = rule(layer, cast(list[Axis], inputs))
            except Refused as e:
                raise ShapeError(f"cannot batch layer {layer.name!r} ({layer.kind}): {e}") from None
            if isinstance(result, Rewrite):
                rewrites.append(result)
                result = result.axis
            out = result
        # A rule gives one axis for all outputs, or one per output (a recurrent layer's differ).
        per_output = out if isinstance(out, tuple) else (out,) * len(layer.outputs)
        for slot, axis in zip(layer.outputs, per_output, strict=True):
            axes[slot] = axis
    return axes, rewrites


def _set_inputs(graph: Graph, batch: int) -> list[str]:
    """Give every input a leading dim of ``batch``; its exported one must be 1 or symbolic."""
    changes = []
    for layer in graph.input_layers:
        info = layer.descriptor.info
        shape = info.shape
        if not shape or (isinstance(shape[0], int) and shape[0] != 1 and shape[0] != batch):
            raise ShapeError(
                f"cannot batch input {layer.descriptor.name!r}: a leading batch dim of 1 (or a "
                f"symbolic one) is expected, found shape {shape}"
            )
        if shape[0] != batch:
            new = info.with_shape((batch, *shape[1:]))
            layer.descriptor = attrs.evolve(layer.descriptor, info=new)
            changes.append(f"input {layer.descriptor.name!r}: {tuple(shape)} -> {tuple(new.shape)}")
    return changes


def rebatch(graph: Graph, batch: int) -> list[str]:
    """Re-shape ``graph`` in place to run ``batch`` samples per run; returns the changes made.

    The graph's inputs must have a leading dim of 1 (or a symbolic one); ShapeError when they
    do not or when a layer could mix samples (the graph is then left at batch 1).
    """
    if not isinstance(batch, int) or isinstance(batch, bool) or batch < 1:
        raise ShapeError(f"batch must be a positive int, got {batch!r}")
    _set_inputs(graph, 1)
    graph.infer_shapes()
    _, rewrites = prove_batch_axes(graph)
    changes = _set_inputs(graph, batch)
    changes += [rewrite.apply(graph, batch) for rewrite in rewrites] if batch != 1 else []
    graph.remove_unread_constants()
    graph.infer_shapes()
    return changes


def _check_backends(optimized: OptimizedNetwork, registry: BackendRegistry, batch: int) -> None:
    supports = {bid: registry.get(bid).layer_support() for bid in optimized.backends}
    for layer in optimized.graph:
        if layer.backend is None:
            continue
        support = supports[layer.backend].is_layer_supported(
            layer.kind, layer.descriptor, layer.input_infos, layer.output_infos
        )
        if not support.supported:
            raise UnsupportedLayerError(
                f"backend {layer.backend} does not take layer {layer.name!r} ({layer.kind}) at "
                f"batch {batch}: {support.reason}"
            )


@overload
def set_batch(model: Network, batch: int, registry: BackendRegistry | None = None) -> Network: ...
@overload
def set_batch(
    model: OptimizedNetwork, batch: int, registry: BackendRegistry | None = None
) -> OptimizedNetwork: ...
def set_batch(
    model: Network | OptimizedNetwork, batch: int, registry: BackendRegistry | None = None
) -> Network | OptimizedNetwork:
    """A copy of ``model`` (a Network or an OptimizedNetwork) that runs ``batch`` samples per run.

    Constants are shared with ``model``, which is left unchanged. Layers of an optimized network
    keep their backends; each backend is asked again whether it takes its layers at the new
    shapes (UnsupportedLayerError when one does not). Raises ShapeError when the network cannot
    be proven to keep samples apart (see the module docstring).
    """
    if isinstance(model, Network):
        network = Network()
        network.graph = model.graph.copy()
        network.graph.validate()
        rebatch(network.graph, batch)
        return network
    if not isinstance(model, OptimizedNetwork):
        raise TypeError(f"set_batch expects a Network or an OptimizedNetwork, got {type(model).__name__}")
    graph = model.graph.copy()
    changes = rebatch(graph, batch)
    batched = copy.copy(model)
    batched.graph = graph
    batched.passes = [*model.passes, *changes]
    batched.prepared = {}  # prepared for the exported shapes; the backends prepare again
    _check_backends(batched, registry or backend_registry(), batch)
    return batched
