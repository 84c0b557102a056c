"""optimize(): graph passes, then each layer assigned to the first backend that takes it.

As Arm NN's ``Optimize``: every backend in the preference list is asked about every layer and
its answer recorded; each backend then sees its own subgraphs (``optimize_subgraph``): its
substitutions are applied, the ones it fails go to the next backend in the list. Last, the
tensors that cross between backends are recorded as copies or zero-copy imports.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

import attrs
import numpy as np

from flowrt.defaults import backend_ids, default_backends
from flowrt.engine.graph.graph import Graph, Layer, constant_value, workload_info
from flowrt.engine.graph.network import Network
from flowrt.engine.graph.passes.collapse_reshape import collapse_reshapes
from flowrt.engine.graph.passes.crossings import Crossing, find_crossings
from flowrt.engine.graph.passes.fold_batch_norm import fold_batch_norm
from flowrt.engine.graph.passes.fold_constants import fold_to_fixpoint
from flowrt.engine.graph.passes.fold_qdq import Accepts, fold_qdq, fold_qdq_binaries
from flowrt.engine.graph.passes.fold_scale_shift import fold_scale_shift
from flowrt.engine.graph.passes.fold_transpose import fold_transposes
from flowrt.engine.graph.passes.fuse_activation import fuse_activations
from flowrt.engine.graph.passes.pool_before_conv import pool_before_conv
from flowrt.engine.graph.passes.reduce_fp16 import reduce_fp32_to_fp16
from flowrt.engine.graph.passes.remove_identity import remove_pass_through
from flowrt.engine.graph.passes.substitute import SubstitutionRecord, check_coverage, substitute
from flowrt.engine.graph.report import format_report
from flowrt.engine.graph.subgraph import connected_subgraphs
from flowrt.engine.memory.budget import check_memory_budget
from flowrt.errors import BackendError, GraphError, InputError, UnsupportedLayerError
from flowrt.gc_pause import collection_paused
from flowrt.registry import Backend, BackendRegistry, OptimizationViews, backend_registry
from flowrt.validate import argument_error, check_bool, check_instance

logger = logging.getLogger(__name__)

DATA_KINDS = ("Input", "Output", "Constant")
# How many times a backend is handed its subgraphs again while it still substitutes.
SUBSTITUTION_ROUNDS = 3


def _hint_pairs(value: Any) -> tuple[tuple[str, str], ...]:
    """``{layer name: backend id}`` (or pairs) as sorted pairs of str, so options stay frozen."""
    if not isinstance(value, Mapping | Sequence) or isinstance(value, str | bytes):
        raise argument_error(
            "layer_backend_hints", "a mapping {layer name: backend id}", value, where="OptimizerOptions"
        )
    pairs = tuple(value.items()) if isinstance(value, Mapping) else tuple(tuple(p) for p in value)
    for pair in pairs:
        if len(pair) != 2 or not all(isinstance(v, str) for v in pair):
            raise InputError(
                f"layer_backend_hints expects {{layer name: backend id}} with str keys and values, found {pair!r}"
            )
    return tuple(sorted(pairs))


def _flag(instance: Any, attribute: attrs.Attribute, value: Any) -> None:
    """An attrs validator: the option is True or False (ArgumentError naming it otherwise)."""
    check_bool(attribute.name, value, where="OptimizerOptions")


@attrs.frozen
class OptimizerOptions:
    """Options of :func:`optimize`.

    ``fold_constants`` evaluates constant subgraphs once (needs CpuRef registered);
    ``fast_math`` lets backends take faster, less exact algorithms (each workload's
    ``WorkloadInfo.fast_math``; on CpuAcc, Winograd's 4x4 tiles: docs/performance.md);
    ``fold_scale_shift`` turns Mul and Add by per-channel constants into BatchNormalization
    (folded into a Conv or BatchNormalization before it by ``fold_batch_norm``);
    ``fuse_activations`` folds an activation into the layer before it where that layer's
    backend can apply one (through its ``optimize_subgraph``, or capability
    ``fused_activation``). ``fold_transposes``
    composes and cancels chains of Transpose; ``collapse_reshapes`` makes a chain of
    reshapes one Reshape. ``pool_before_conv`` moves an AveragePool before the 1x1 conv it
    reads (the two commute), so that the conv multiplies fewer pixels (DenseNet's
    transitions); results change by rounding only. ``fold_qdq`` makes each QDQ group of a
    quantized model (DequantizeLinear -> Conv, MatMul, Add or Mul -> QuantizeLinear) one
    QLinearConv, QLinearMatMul, QLinearAdd or QLinearMul where a backend with integer kernels
    takes it (``passes/fold_qdq.py``).
    ``reduce_fp32_to_fp16`` runs float32 layers in float16 on the backends that declare
    capability ``fp16`` (casts at their borders), and has those that declare ``fp16_weights``
    (CpuAcc) keep their layers' constant weights as float16, computing in float32 (ignored,
    and reported, where no backend does either). ``layer_backend_hints`` (``{layer name:
    backend id}``) puts a layer on a backend of the preference list whatever the order says; an
    UnsupportedLayerError when that backend does not support it. ``memory_budget`` (bytes;
    None: half the machine's physical memory) bounds the network's constants with what
    constant folding makes; ResourceError, naming the layer, before a fold would pass it.
    """

    fold_constants: bool = attrs.field(default=True, validator=_flag)
    fold_batch_norm: bool = attrs.field(default=True, validator=_flag)
    fold_scale_shift: bool = attrs.field(default=True, validator=_flag)
    fast_math: bool = attrs.field(default=False, validator=_flag)
    fuse_activations: bool = attrs.field(default=True, validator=_flag)
    fold_transposes: bool = attrs.field(default=True, validator=_flag)
    collapse_reshapes: bool = attrs.field(default=True, validator=_flag)
    pool_before_conv: bool = attrs.field(default=True, validator=_flag)
    fold_qdq: bool = attrs.field(default=True, validator=_flag)
    reduce_fp32_to_fp16: bool = attrs.field(default=False, validator=_flag)
    layer_backend_hints: tuple[tuple[str, str], ...] = attrs.field(default=(), converter=_hint_pairs)
    memory_budget: int | None = attrs.field(default=None, converter=check_memory_budget)

    @property
    def hints(self) -> dict[str, str]:
        """``layer_backend_hints`` as ``{layer name: backend id}``."""
        return dict(self.layer_backend_hints)


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
        substitutions: list[SubstitutionRecord] | None = None,
        crossings: list[Crossing] | None = None,
    ) -> None:
        self.graph = graph
        self.backends = backends
        self.decisions = decisions
        self.passes = passes
        self.options = options
        # What backends' optimize_subgraph replaced, and where data crosses between backends.
        self.substitutions = list(substitutions or [])
        self.crossings = list(crossings or [])
        # Backend-prepared data, {backend id: ((major, minor), {layer name: bytes})}: what
        # flowrt.load found in a .flowrt file for the registered version of a backend.
        self.prepared: dict[str, tuple[tuple[int, int], dict[str, bytes | memoryview]]] = {}
        # The cache file it was read from (``flowrt.network_cache``), or None: optimized here.
        self.cached_from: str | None = None

    def assignments(self) -> dict[str, str]:
        """``{layer_name: backend_id}`` for every compute layer, in execution order."""
        return {layer.name: layer.backend for layer in self.graph.topological_order() if layer.backend}

    def backend_counts(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for backend in self.assignments().values():
            counts[backend] = counts.get(backend, 0) + 1
        return counts

    def fallbacks(self) -> dict[str, Assignment]:
        """The layers not on the first backend of the preference list, with their decisions."""
        return {
            name: self.decisions[name]
            for name, backend in self.assignments().items()
            if backend != self.backends[0] and name in self.decisions
        }

    def copies(self) -> list[Crossing]:
        """The tensors copied between memories (host and a device) per run."""
        return [c for c in self.crossings if c.method == "copy"]

    def imports(self) -> list[Crossing]:
        """The tensors read in place across backends that share memory (zero-copy)."""
        return [c for c in self.crossings if c.method == "import"]

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


def _assign(
    graph: Graph, order: list[str], backends: dict[str, Backend], hints: dict[str, str], passes: list[str]
) -> dict[str, Assignment]:
    ask = _asker(backends)
    decisions = {}
    for layer in graph.topological_order():
        if layer.kind in DATA_KINDS:
            continue
        answers = ask(layer)
        chosen = hints.get(layer.name) or next((bid for bid in order if answers[bid][0]), None)
        if chosen is None:
            raise _unsupported(layer, answers)
        if not answers[chosen][0]:
            raise UnsupportedLayerError(
                f"layer_backend_hints puts layer {layer.name!r} ({layer.kind}) on {chosen}, which does "
                f"not support it: {answers[chosen][1] or 'declined'}"
            )
        layer.backend = chosen
        declined = {bid: reason for bid, (ok, reason) in answers.items() if not ok}
        decisions[layer.name] = Assignment(chosen, declined)
        if layer.name in hints:
            passes.append(f"layer {layer.name!r} placed on {chosen} by layer_backend_hints")
        elif declined and order.index(chosen) > 0:
            logger.info("layer %r (%s) falls back to %s: %s", layer.name, layer.kind, chosen, declined)
    return decisions


def _check_hints(
    hints: dict[str, str], order: list[str], network_layers: set[str], graph: Graph
) -> list[str]:
    """Raise for a hint naming a layer the network lacks or a backend not in ``order``;
    report the hints whose layers the graph passes removed."""
    unused = []
    for name, bid in hints.items():
        if bid not in order:
            raise BackendError(
                f"layer_backend_hints puts layer {name!r} on {bid!r}; expected a backend of the "
                f"preference list {order}"
            )
        if name not in network_layers:
            raise GraphError(f"layer_backend_hints names layer {name!r}, which the network does not have")
        if name not in graph.layers:
            logger.info("layer_backend_hints: layer %r was removed by the graph passes", name)
            unused.append(f"layer_backend_hints: layer {name!r} was removed by the graph passes; hint unused")
    return unused


def _reassign(layer: Layer, bid: str, later: list[str], decisions: dict[str, Assignment], ask, hints) -> str:
    """Give ``layer``, failed by ``bid``, to the first backend in ``later`` that takes it."""
    if layer.name in hints:
        raise BackendError(
            f"backend {bid} failed the subgraph of layer {layer.name!r}, which layer_backend_hints puts on it"
        )
    answers = ask(layer)
    nxt = next((b for b in later if answers[b][0]), None)
    if nxt is None:
        raise _unsupported(layer, answers)
    layer.backend = nxt
    declined = dict(decisions[layer.name].declined)
    declined[bid] = "optimize_subgraph reported the subgraph as failed"
    decisions[layer.name] = Assignment(nxt, declined)
    logger.info("backend %s failed layer %r; re-assigned to %s", bid, layer.name, nxt)
    return f"{bid} failed layer {layer.name!r}; re-assigned to {nxt}"


def _apply_substitutions(
    graph: Graph, bid: str, views: OptimizationViews, backend: Backend, decisions: dict[str, Assignment]
) -> list[SubstitutionRecord]:
    """Put each substitution ``views`` holds into ``graph``, its layer assigned to ``bid``."""
    records = []
    moved: dict = {}
    for sub in views.substitutions:
        declined = decisions[next(iter(sub.subgraph)).name].declined
        layer, record = substitute(graph, bid, sub.subgraph, sub.replacement, backend.layer_support(), moved)
        for name in record.replaced:
            decisions.pop(name, None)
        decisions[layer.name] = Assignment(bid, declined)
        logger.info("substitution by %s", record.describe())
        records.append(record)
    return records


def _optimize_subgraphs(
    graph: Graph,
    order: list[str],
    backends: dict[str, Backend],
    decisions: dict[str, Assignment],
    passes: list[str],
    options: OptimizerOptions,
) -> list[SubstitutionRecord]:
    """Hand each backend its subgraphs; apply its substitutions and re-assign the layers of
    the subgraphs it failed down the list (Arm NN's ApplyBackendOptimizations)."""
    ask = _asker(backends)
    records: list[SubstitutionRecord] = []
    for position, bid in enumerate(order):
        # A substitution's layer may take part in the next (x * Sigmoid(x) becomes a Swish in
        # one round, which the Conv before it takes as its activation in the next).
        for _ in range(SUBSTITUTION_ROUNDS):
            done = len(records)
            mine = [layer for layer in graph if layer.backend == bid]
            for view in connected_subgraphs(graph, mine, options):
                views = backends[bid].optimize_subgraph(view)
                check_coverage(bid, view, views)
                records.extend(_apply_substitutions(graph, bid, views, backends[bid], decisions))
                for failed in views.failed:
                    for layer in failed:
                        passes.append(
                            _reassign(layer, bid, order[position + 1 :], decisions, ask, options.hints)
                        )
            if len(records) == done:
                break
    if records:  # constants only the replaced layers read (a GELU's 0.5, a norm's epsilon)
        graph.remove_unread_constants()
    return records


def _evaluator(registry: BackendRegistry):
    if not registry.is_registered("CpuRef"):
        return None
    factory = registry.get("CpuRef").create_workload_factory(None)

    def evaluate(layer: Layer, inputs: Sequence[np.ndarray | None]) -> Sequence[np.ndarray]:
        return factory.create_workload(workload_info(layer)).execute(inputs)

    return evaluate


def _quantized_accepts(instances: dict[str, Backend]) -> Accepts:
    """Whether a backend with integer kernels (capability ``quantized_kernels``) takes a layer."""
    fast = [b.layer_support() for b in instances.values() if b.capabilities.get("quantized_kernels")]

    def accepts(kind: str, descriptor: Any, inputs: list, outputs: list) -> bool:
        return any(s.is_layer_supported(kind, descriptor, inputs, outputs).supported for s in fast)

    return accepts


def _graph_passes(
    graph: Graph, options: OptimizerOptions, registry: BackendRegistry, instances: dict[str, Backend]
) -> list[str]:
    passes = remove_pass_through(graph)
    accepts = _quantized_accepts(instances)
    if options.fold_qdq:  # before constant folding, which would make the weights float
        passes += fold_qdq(graph, accepts)
    evaluate = _evaluator(registry) if options.fold_constants else None
    if evaluate is not None:
        passes += fold_to_fixpoint(graph, evaluate, options.memory_budget)
    if options.fold_qdq:  # its constants float32 now, its shapes known
        passes += fold_qdq_binaries(graph, accepts)
    if options.fold_scale_shift:
        passes += fold_scale_shift(graph)
    if options.fold_batch_norm:
        passes += fold_batch_norm(graph)
    if options.fold_transposes:
        passes += fold_transposes(graph)
    if options.collapse_reshapes:
        passes += collapse_reshapes(graph)
    if options.pool_before_conv:
        passes += pool_before_conv(graph)
    graph.infer_shapes()
    return passes


def _fp16(
    graph: Graph, order: list[str], backends: dict[str, Backend], decisions: dict[str, Assignment]
) -> list[str]:
    """``reduce_fp32_to_fp16`` on the backends that declare fp16; each Cast it inserts goes to
    the converted layer's backend when that takes it, else to the first in ``order`` that does."""
    capabilities = {bid: backend.capabilities for bid, backend in backends.items()}
    stored = _fp16_weights(graph, capabilities)
    if not any(c.get("fp16") for c in capabilities.values()):
        if stored:
            return stored
        logger.info("reduce_fp32_to_fp16: no backend in %s declares fp16; nothing reduced", order)
        return [f"reduce_fp32_to_fp16: no backend in {order} declares fp16; nothing reduced"]
    ask = _asker(backends)

    def place(cast: Layer, near: str) -> None:
        answers = ask(cast)
        chosen = next((bid for bid in [near, *order] if answers[bid][0]), None)
        if chosen is None:
            raise _unsupported(cast, answers)
        cast.backend = chosen
        decisions[cast.name] = Assignment(chosen, {b: r for b, (ok, r) in answers.items() if not ok})

    supports = {bid: backend.layer_support() for bid, backend in backends.items()}
    return stored + reduce_fp32_to_fp16(graph, supports, capabilities, place)


def _fp16_weights(graph: Graph, capabilities: dict[str, Any]) -> list[str]:
    """What the backends that declare ``fp16_weights`` (the layer kinds whose constant float32
    weights they keep as float16, computing in float32) do with ``reduce_fp32_to_fp16``: one
    line per backend, counting its layers of those kinds with constant float32 weights."""
    lines = []
    for bid, caps in capabilities.items():
        kinds = caps.get("fp16_weights") or ()
        layers = [
            layer
            for layer in graph.topological_order()
            if layer.backend == bid
            and layer.kind in kinds
            and len(layer.inputs) > 1
            and (value := constant_value(layer.inputs[1].source)) is not None
            and value.dtype == np.float32
        ]
        if layers:
            lines.append(
                f"reduce_fp32_to_fp16: {bid} keeps the weights of {len(layers)} "
                f"{'/'.join(sorted({layer.kind for layer in layers}))} layers as float16 where its kernels "
                "read them so, computing in float32"
            )
            logger.info(lines[-1])
    return lines


def _check_named(instances: dict[str, Backend]) -> None:
    """Each backend the caller named checks that it can run here (an optional
    ``check_available``, as GpuAcc's, raising BackendError): naming a backend the machine
    lacks is an error, not a list that silently runs on the next one."""
    for backend in instances.values():
        check = getattr(backend, "check_available", None)
        if check is not None:
            check()


def _default_order(registry: BackendRegistry) -> list[str]:
    """The default list (``flowrt.defaults.default_backends``) less what ``registry`` lacks."""
    wanted = default_backends()
    order = [bid for bid in wanted if registry.is_registered(bid)]
    if not order:
        known = ", ".join(registry.ids()) or "none"
        raise BackendError(
            f"optimize: no backend of the default list ({', '.join(wanted)}) is registered in the "
            f"registry given (registered: {known}); pass backends=[...]"
        )
    return order


def preference_order(backends: Sequence[str] | None, registry: BackendRegistry) -> list[str]:
    """The backend ids :func:`optimize` tries, in order, for its ``backends`` argument."""
    if backends is None:
        return _default_order(registry)
    return list(dict.fromkeys(backend_ids(backends, "optimize")))


@collection_paused()
def optimize(
    network: Network | Graph,
    backends: Sequence[str] | None = None,
    options: OptimizerOptions | None = None,
    registry: BackendRegistry | None = None,
) -> OptimizedNetwork:
    """Run the graph passes and assign every layer to the first backend in ``backends`` that takes it.

    ``backends`` is a preference list of backend ids (or one id as a string); None (the
    default) is the fastest list available, ``flowrt.defaults.default_backends()``: CpuAcc,
    CpuRef, with GpuAcc first where OpenCL shows a GPU (the first such call probes OpenCL).
    Raises UnsupportedLayerError (listing each backend's reason) when none takes a layer, and
    BackendError for an unknown backend id or a named one that cannot run here (GpuAcc
    without OpenCL). The network itself is left unchanged.
    """
    check_instance("network", network, (Network, Graph), "a flowrt.Network", where="optimize")
    options = OptimizerOptions() if options is None else options
    check_instance(
        "options", options, OptimizerOptions, "a flowrt.OptimizerOptions or None", where="optimize"
    )
    registry = backend_registry() if registry is None else registry
    check_instance(
        "registry", registry, BackendRegistry, "a flowrt.BackendRegistry or None", where="optimize"
    )
    order = preference_order(backends, registry)
    if not order:
        raise BackendError("the backend preference list is empty")
    instances = {bid: registry.get(bid) for bid in order}
    if backends is not None:
        _check_named(instances)
    graph = (network.graph if isinstance(network, Network) else network).copy()
    graph.validate()
    network_layers = set(graph.layers)
    passes = _graph_passes(graph, options, registry, instances)
    passes += _check_hints(options.hints, order, network_layers, graph)
    decisions = _assign(graph, order, instances, options.hints, passes)
    substitutions = _optimize_subgraphs(graph, order, instances, decisions, passes, options)
    capabilities = {bid: backend.capabilities for bid, backend in instances.items()}
    if options.fuse_activations:
        passes += fuse_activations(graph, capabilities)
    if options.reduce_fp32_to_fp16:
        passes += _fp16(graph, order, instances, decisions)
    decisions = {name: d for name, d in decisions.items() if name in graph.layers}
    crossings = find_crossings(graph, capabilities)
    return OptimizedNetwork(graph, order, decisions, passes, options, substitutions, crossings)
