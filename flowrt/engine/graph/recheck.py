"""Checking again an optimized network that comes from elsewhere (a ``.flowrt`` file, whose
checksum anyone can recompute): what ``Network`` and ``optimize`` would have refused.

Its inputs and outputs must have distinct str names (two outputs of one name would lose one
silently), and every layer must be one its backend accepts as it stands, fused activation
included: a backend handed a layer it did not accept may run it wrong without a word (CpuRef
once ran a Conv with a fused Relu as a plain Conv). So the loader asks each backend again, as
the optimizer did.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from flowrt.engine.graph.graph import Layer
from flowrt.engine.graph.optimizer import OptimizedNetwork
from flowrt.errors import BackendError, GraphError, UnsupportedLayerError
from flowrt.registry import BackendRegistry


def activation_problem(layer: Layer, backend: str, capabilities: Mapping[str, Any]) -> str:
    """Why ``backend`` (of ``capabilities``) cannot apply ``layer``'s fused activation; "" when
    it can: the backend lists the layer's kind under capability ``fused_activation``, and the
    layer has one floating-point output (``fuse_activations`` fuses into float32 outputs only;
    ``reduce_fp32_to_fp16`` may make them float16 after)."""
    kinds = capabilities.get("fused_activation", ())
    if layer.kind not in kinds:
        listed = f"{', '.join(sorted(kinds))} only" if kinds else "no layer kind"
        return f"{backend} applies fused activations to {listed} (capability fused_activation)"
    infos = layer.output_infos
    if len(infos) != 1 or infos[0] is None or not infos[0].dtype.is_float:
        found = ", ".join(str(i) for i in infos)
        return f"a fused activation needs one floating-point output, the layer has {found or 'none'}"
    return ""


def _refusal(layer: Layer, backend: str, support: Any, capabilities: Mapping[str, Any]) -> str:
    """Why the backend does not take ``layer`` as it stands; "" when it does."""
    try:
        answer = support.is_layer_supported(
            layer.kind, layer.descriptor, layer.input_infos, layer.output_infos
        )
        supported, reason = bool(answer.supported), answer.reason
    except Exception as e:  # a backend's bug is a refusal, as in optimize
        return f"its layer support raised {type(e).__name__}: {e}"
    if not supported:
        return reason or "declined"
    if layer.activation is not None:
        problem = activation_problem(layer, backend, capabilities)
        if problem:
            return f"it carries a fused {layer.activation.kind}: {problem}"
    return ""


def check_assignments(optimized: OptimizedNetwork, registry: BackendRegistry) -> None:
    """Raise UnsupportedLayerError for the first layer whose backend does not accept it as it
    stands (kind, descriptor, tensor infos, fused activation), naming the layer, the backend
    and its reason; BackendError for a backend ``registry`` does not hold."""
    backends: dict[str, tuple[Any, Mapping[str, Any]]] = {}
    for layer in optimized.graph.topological_order():
        bid = layer.backend
        if bid is None:
            continue
        if bid not in backends:
            if not registry.is_registered(bid):
                raise BackendError(
                    f"layer {layer.name!r} ({layer.kind}) is on backend {bid}, which is not registered: "
                    "register it first (a Runtime registers the dynamic backends it finds when it is made)"
                )
            backend = registry.get(bid)
            try:
                backends[bid] = (backend.layer_support(), dict(backend.capabilities))
            except Exception as e:  # a backend's bug: nothing it would run can be checked
                raise BackendError(
                    f"backend {bid} failed to give its layer support: {type(e).__name__}: {e}"
                ) from e
        reason = _refusal(layer, bid, *backends[bid])
        if reason:
            raise UnsupportedLayerError(
                f"layer {layer.name!r} ({layer.kind}) is on backend {bid}, which does not take it: {reason}"
            )


def check_interface(optimized: OptimizedNetwork) -> None:
    """Raise GraphError unless the Input layers, and the Output layers, have distinct str names."""
    for kind, layers in (("input", optimized.graph.input_layers), ("output", optimized.graph.output_layers)):
        seen: set[str] = set()
        for layer in layers:
            name = layer.descriptor.name
            if type(name) is not str or name in seen:
                found = (
                    f"a second {kind} called {name!r}" if type(name) is str else f"a {type(name).__name__}"
                )
                raise GraphError(
                    f"layer {layer.name!r} ({layer.kind}): expected a distinct str {kind} name, found {found}"
                )
            seen.add(name)


def recheck(optimized: OptimizedNetwork, registry: BackendRegistry) -> None:
    """:func:`check_interface`, then :func:`check_assignments`."""
    check_interface(optimized)
    check_assignments(optimized, registry)


__all__ = ["activation_problem", "check_assignments", "check_interface", "recheck"]
