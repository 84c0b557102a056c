"""Activations written out of small ops, found and offered as one layer (as ONNX Runtime's
GeluFusion, FastGeluFusion, QuickGeluFusion and HardSwish fusions):

- ``x * Sigmoid(x)`` -> Swish (alpha 1): SiLU, in EfficientNet and every LLaMA MLP;
- ``x * 0.5 * (1 + Erf(x / sqrt(2)))`` -> Gelu; ``0.5 * x * (1 + Tanh(sqrt(2 / pi) *
  (x + 0.044715 * x^3)))`` -> Gelu (approximate tanh), with ``Pow(x, 3)`` or ``x * x * x``;
- ``x * HardSigmoid(x)`` (alpha 1/6, beta 0.5) and ``x * Clip(x + 3, 0, 6) / 6`` -> HardSwish.

Each is ``k * x * gate(x)``: the product is read as a :class:`Monomial`, so the constants may
sit anywhere in it (``Div`` by 1.4142135 or ``Mul`` by 0.70710678; ``Mul`` by 0.5 before or
after), and are checked with ``np.isclose``. ``PATTERN_FUSIONS`` lists every pattern finder,
these and the normalizations of ``norm_fusions``, for a backend's ``offer_fusions``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from flowrt.engine.graph.graph import Layer, OutputSlot
from flowrt.engine.graph.layer_kind import NoDescriptor
from flowrt.engine.graph.layers.activation import GeluDescriptor
from flowrt.engine.graph.layers.lp_norm import SwishDescriptor
from flowrt.engine.graph.passes.fusions import Fusion
from flowrt.engine.graph.passes.norm_fusions import layer_norm_with_bias, normalization
from flowrt.engine.graph.passes.pattern_match import (
    accept,
    close,
    monomial,
    other_operand,
    producer,
    scalar,
    sources,
)
from flowrt.registry import ReplacementLayer

# What a gate is replaced by: (kind, descriptor, the constant k of k * x * gate(x), its layers).
Gate = tuple[str, Any, float, tuple[Layer, ...]]

SQRT_2_OVER_PI = math.sqrt(2 / math.pi)


def _direct(g: OutputSlot, x: OutputSlot, members: set[str], kind: str) -> Layer | None:
    """The layer of ``kind`` computing ``g`` from ``x`` alone."""
    layer = producer(g, members, kind)
    return layer if layer is not None and sources(layer)[0] is x else None


def _sigmoid(g: OutputSlot, x: OutputSlot, members: set[str]) -> Gate | None:
    """``Sigmoid(x)``: x * it is Swish (SiLU)."""
    layer = _direct(g, x, members, "Sigmoid")
    return None if layer is None else ("Swish", SwishDescriptor(alpha=1.0), 1.0, (layer,))


def _hard_sigmoid(g: OutputSlot, x: OutputSlot, members: set[str]) -> Gate | None:
    """``HardSigmoid(x)`` with HardSwish's alpha 1/6 and beta 0.5."""
    layer = _direct(g, x, members, "HardSigmoid")
    if layer is None or not (close(layer.descriptor.alpha, 1 / 6) and close(layer.descriptor.beta, 0.5)):
        return None
    return "HardSwish", NoDescriptor(), 1.0, (layer,)


def _clip_bounds(clip: Layer) -> tuple[float | None, float | None]:
    """Clip's bounds: attributes before opset 11, constant inputs after (None: unbounded or unknown)."""
    if clip.descriptor.opset < 11:
        return clip.descriptor.min, clip.descriptor.max
    bounds = (sources(clip) + [None, None])[1:3]
    return scalar(bounds[0]), scalar(bounds[1])


def _relu6_shifted(g: OutputSlot, x: OutputSlot, members: set[str]) -> Gate | None:
    """``Clip(x + 3, 0, 6)``: x * it / 6 is HardSwish."""
    clip = producer(g, members, "Clip")
    if clip is None:
        return None
    low, high = _clip_bounds(clip)
    if not (close(low, 0.0) and close(high, 6.0)):
        return None
    add = producer(sources(clip)[0], members, "Add")
    if add is None or not close(scalar(other_operand(add, x)), 3.0):
        return None
    return "HardSwish", NoDescriptor(), 1 / 6, (add, clip)


def _one_plus(g: OutputSlot, members: set[str], kind: str) -> tuple[Layer, Layer] | None:
    """``1 + kind(...)``, in either order: (the Add, the ``kind`` layer)."""
    add = producer(g, members, "Add")
    if add is None:
        return None
    for inner, one in (sources(add), sources(add)[::-1]):
        layer = producer(inner, members, kind)
        if layer is not None and close(scalar(one), 1.0):
            return add, layer
    return None


def _erf(g: OutputSlot, x: OutputSlot, members: set[str]) -> Gate | None:
    """``1 + Erf(x / sqrt(2))``: x * 0.5 * it is Gelu."""
    found = _one_plus(g, members, "Erf")
    if found is None:
        return None
    add, erf = found
    scaled = monomial(sources(erf)[0], members)
    if not scaled.is_power(x, 1, 1 / math.sqrt(2)):
        return None
    return "Gelu", GeluDescriptor("none"), 0.5, (*scaled.layers, erf, add)


def _tanh(g: OutputSlot, x: OutputSlot, members: set[str]) -> Gate | None:
    """``1 + Tanh(sqrt(2 / pi) * (x + 0.044715 * x^3))``: x * 0.5 * it is Gelu (tanh)."""
    found = _one_plus(g, members, "Tanh")
    if found is None:
        return None
    add, tanh = found
    scaled = monomial(sources(tanh)[0], members)
    if len(scaled.num) != 1 or scaled.den or not close(scaled.scale, SQRT_2_OVER_PI):
        return None
    inner = producer(scaled.num[0], members, "Add")
    cubic = monomial(other_operand(inner, x), members) if inner is not None else None
    if inner is None or cubic is None or not cubic.is_power(x, 3, 0.044715):
        return None
    return "Gelu", GeluDescriptor("tanh"), 0.5, (*cubic.layers, inner, *scaled.layers, tanh, add)


GATES: tuple[Callable[[OutputSlot, OutputSlot, set[str]], Gate | None], ...] = (
    _sigmoid,
    _hard_sigmoid,
    _relu6_shifted,
    _erf,
    _tanh,
)


def gated_activation(layer: Layer, members: set[str]) -> Fusion | None:
    """``k * x * gate(x)`` computed by ``layer`` (a Mul or Div) -> one activation layer."""
    if layer.kind not in ("Mul", "Div"):
        return None
    product = monomial(layer.outputs[0], members)
    if len(product.num) != 2 or product.den:
        return None
    for x, g in (product.num, product.num[::-1]):
        for gate in GATES:
            found = gate(g, x, members)
            if found is not None and close(product.scale, found[2]):
                kind, descriptor, _, layers = found
                replacement = ReplacementLayer(kind, descriptor, (x,), None, layer.name)
                return accept([*layers, *product.layers], layer, replacement, members)
    return None


# Every pattern finder, ``(layer, members) -> Fusion | None``, in the order offer_fusions runs
# them: a LayerNormalization with its bias before one without.
PATTERN_FUSIONS = (gated_activation, layer_norm_with_bias, normalization)
