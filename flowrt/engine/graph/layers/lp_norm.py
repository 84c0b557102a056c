"""LpNormalization, Shrink and Swish: one-input layers whose output has the input's info."""

from __future__ import annotations

import attrs

from flowrt.engine.graph.layer_kind import ActivationFact, layer_kind
from flowrt.engine.graph.layers.elementwise import FLOAT_TYPES, NUMERIC_TYPES, same_info_infer
from flowrt.engine.graph.shapes import normalize_axis


@attrs.frozen
class LpNormalizationDescriptor:
    """LpNormalization: divide by the L1 (``p`` 1) or L2 (``p`` 2) norm along ``axis``; a zero
    norm gives zeros."""

    axis: int = -1
    p: int = attrs.field(default=2, validator=attrs.validators.in_((1, 2)))


_float_same_info = same_info_infer(FLOAT_TYPES)


@layer_kind("LpNormalization", LpNormalizationDescriptor)
def infer_lp_normalization(desc: LpNormalizationDescriptor, inputs, consts):
    x = inputs[0]
    if x.shape is not None:
        normalize_axis(desc.axis, len(x.shape), "LpNormalization")
    return _float_same_info(desc, inputs, consts)


@attrs.frozen
class ShrinkDescriptor:
    """Shrink: x - bias above ``lambd``, x + bias below -``lambd``, 0 in between."""

    bias: float = 0.0
    lambd: float = 0.5


layer_kind("Shrink", ShrinkDescriptor)(same_info_infer(NUMERIC_TYPES))


@attrs.frozen
class SwishDescriptor:
    """Swish (opset 24): x * sigmoid(``alpha`` * x)."""

    alpha: float = 1.0


def _swish_alpha(descriptor: SwishDescriptor, constants: object) -> tuple[float, float]:
    return float(descriptor.alpha), 0.0


layer_kind("Swish", SwishDescriptor, activation=ActivationFact(12, _swish_alpha, fused="curve"))(
    _float_same_info
)
