"""optimize(): graph passes, then each layer assigned to the first backend that takes it.

As Arm NN's ``Optimize``: every backend in the preference list is asked about every layer and
its answer recorded; each backend then sees its own subgraphs (``optimize_subgraph``), and the
ones it fails go to the next backend in the list.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import attrs
import numpy as np

from flowrt.engine.graph.graph import Graph, Layer, workload_info
from flowrt.engine.graph.network import Network
from flowrt.engine.graph.passes.fold_batch_norm import fold_batch_norm
from flowrt.engine.graph.passes.fold_constants import fold_constants
from flowrt.engine.graph.passes.fold_scale_shift import fold_scale_shift
from flowrt.engine.graph.passes.fuse_activation import fuse_activations
from flowrt.engine.graph.passes.remove_identity import remove_pass_through
from flowrt.engine.graph.report import format_report
from flowrt.engine.graph.subgraph import connected_subgraphs
from flowrt.errors import BackendError, UnsupportedLayerError
from flowrt.registry import Backend, BackendRegistry, backend_registry

logger = logging.getLogger(__name__)

DATA_KINDS = ("Input", "Output", "Constant")


@attrs.frozen
class OptimizerOptions:
    """Options of :func:`optimize`.

    ``fold_constants`` evaluates constant subgraphs once (needs CpuRef registered);
    ``fast_math`` lets backends trade exactness for speed (passed to their kernels);
    ``fold_scale_shift`` turns Mul and Add by per-channel constants into BatchNormalization
    (folded into a Conv before it by ``fold_batch_norm``); ``fuse_activations`` folds an activation into the layer before it where that layer's
    backend declares it can apply one (capability ``fused_activation``).
    """

    fold_constants: bool = True
    fold_batch_norm: bool = True
    fold_scale_shift: bool = True
    fast_math: bool = False
    fuse_activations: bool = True


@attrs.frozen
class Assignment:
    """Where a layer runs and why the backends before (and after) it declined it."""

    backend: str
    declined: dict[str, str]


class OptimizedNetwork:
    """A graph whose compute layers are each assigned to a backend; what ``Runtime.load`` takes."""

    def __init__(
        self,
        graph: Graph,
        backends: list[str],
        decisions: dict[str, Assignment],
        passes: list[str],
        options: OptimizerOptions,
    ) -> None:
        self.graph = graph
        self.backends = backends
        self.decisions = decisions
        self.passes = passes
        self.options = options
        # Backend-prepared data, {backend id: ((major, minor), {layer name: bytes})}: what
        # flowrt.load found in a .flowrt file for the registered version of a backend.
        self.prepared: dict[str, tuple[tuple[int, int], dict[str, bytes | memoryview]]] = {}

    def assignments(self) -> dict[str, str]:
        """``{layer_name: backend_id}`` for every compute layer, in execution order."""
        return {layer.name: layer.backend for layer in self.graph.topological_order() if layer.backend}  # type: ignore[misc]

    def backend_counts(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for backend in self.assignments().values():
            counts[backend] = counts.get(backend, 0) + 1
        return counts

    def report(self) -> str:
        """The text ``flowrt inspect`` prints: passes, then each layer with its backend."""
        return format_report(self)


def _asker(backends: dict[str, Backend]):
    supports = {bid: b.layer_support() for bid, b in backends.items()}

    def ask(layer: Layer) -> dict[str, tuple[bool, str]]:
        answers = {}
        for bid, support in supports.items():
            try:
                s = support.is_layer_supported(
                    layer.kind, layer.descriptor, layer.input_infos, layer.output_infos
                )
                answers[bid] = (s.supported, s.reason)
            except Exception as e:  # a backend's bug must not stop the optimizer
                answers[bid] = (False, f"layer support raised {type(e).__name__}: {e}")
        return answers

    return ask


def _unsupported(layer: Layer, answers: dict[str, tuple[bool, str]]) -> UnsupportedLayerError:
    reasons = "; ".join(f"{bid}: {reason or 'declined'}" for bid, (_, reason) in answers.items())
    return UnsupportedLayerError(
        f"no backend in the preference list supports layer {layer.name!r} ({layer.kind}): {reasons}"
    )


def _assign(graph: Graph, order: list[str], backends: dict[str, Backend]) -> dict[str, Assignment]:
    ask = _asker(backends)
    decisions = {}
    for layer in graph.topological_order():
        if layer.kind in DATA_KINDS:
            continue
        answers = ask(layer)
        chosen = next((bid for bid in order if answers[bid][0]), None)
        if chosen is None:
            raise _unsupported(layer, answers)
        layer.backend = chosen
        declined = {bid: reason for bid, (ok, reason) in answers.items() if not ok}
        decisions[layer.name] = Assignment(chosen, declined)
        if declined and order.index(chosen) > 0:
            logger.info("layer %r (%s) falls back to %s: %s", layer.name, layer.kind, chosen, declined)
    return decisions


def _optimize_subgraphs(
    graph: Graph,
    order: list[str],
    backends: dict[str, Backend],
    decisions: dict[str, Assignment],
    passes: list[str],
) -> None:
    """Hand each backend its subgraphs; re-assign the layers of failed ones down the list."""
    ask = _asker(backends)
    for position, bid in enumerate(order):
        mine = [layer for layer in graph if layer.backend == bid]
        for view in connected_subgraphs(graph, mine):
            views = backends[bid].optimize_subgraph(view)
            if views.substitutions:
                raise BackendError(
                    f"backend {bid} returned substitutions, which this version of flowrt does not apply"
                )
            for failed in views.failed:
                for layer in failed:
                    answers = ask(layer)
                    nxt = next((b for b in order[position + 1 :] if answers[b][0]), None)
                    if nxt is None:
                        raise _unsupported(layer, answers)
                    layer.backend = nxt
                    declined = dict(decisions[layer.name].declined)
                    declined[bid] = "optimize_subgraph reported the subgraph as failed"
                    decisions[layer.name] = Assignment(nxt, declined)
                    passes.append(f"{bid} failed layer {layer.name!r}; re-assigned to {nxt}")


def _evaluator(registry: BackendRegistry):
    if not registry.is_registered("CpuRef"):
        return None
    factory = registry.get("CpuRef").create_workload_factory(None)

    def evaluate(layer: Layer, inputs: Sequence[np.ndarray | None]) -> Sequence[np.ndarray]:
        return factory.create_workload(workload_info(layer)).execute(inputs)

    return evaluate


def optimize(
    network: Network | Graph,
    backends: Sequence[str] = ("CpuRef",),
    options: OptimizerOptions | None = None,
    registry: BackendRegistry | None = None,
) -> OptimizedNetwork:
    """Run the graph passes and assign every layer to the first backend in ``backends`` that takes it.

    Raises UnsupportedLayerError (listing each backend's reason) when none takes a layer, and
    BackendError for an unknown backend id. The network itself is left unchanged.
    """
    options = options or OptimizerOptions()
    registry = registry or backend_registry()
    order = list(dict.fromkeys(backends))
    if not order:
        raise BackendError("the backend preference list is empty")
    instances = {bid: registry.get(bid) for bid in order}
    graph = (network.graph if isinstance(network, Network) else network).copy()
    graph.validate()
    passes = remove_pass_through(graph)
    evaluate = _evaluator(registry) if options.fold_constants else None
    if evaluate is not None:
        passes += fold_constants(graph, evaluate)
    if options.fold_scale_shift:
        passes += fold_scale_shift(graph)
    if options.fold_batch_norm:
        passes += fold_batch_norm(graph)
    graph.infer_shapes()
    decisions = _assign(graph, order, instances)
    _optimize_subgraphs(graph, order, instances, decisions, passes)
    if options.fuse_activations:
        capabilities = {bid: backend.capabilities for bid, backend in instances.items()}
        passes += fuse_activations(graph, capabilities)
        decisions = {name: d for name, d in decisions.items() if name in graph.layers}
    return OptimizedNetwork(graph, order, decisions, passes, options)
