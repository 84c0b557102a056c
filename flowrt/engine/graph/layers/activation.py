"""Activation layers: Relu and its relatives, sigmoid-like curves, Gelu, PRelu and Clip.

Each keeps its input's shape and dtype. Attribute defaults are ONNX's; Selu's changed at
opset 6 and Clip's bounds moved from attributes to optional inputs at opset 11.

The activations that kernels apply by code declare their :class:`ActivationFact` here, with
their kind: its code in the backends' ``activate()`` switches, who fuses it (those fused
"everywhere" are in GpuAcc's ``common.cl`` too; the curves in CpuAcc's epilogue only), and how
the descriptor gives ``alpha`` and ``beta``. A new activation takes the next free code.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import attrs
import numpy as np

from flowrt.engine.graph.layer_kind import ActivationFact, as_tuple, layer_kind
from flowrt.engine.graph.layers.elementwise import (
    FLOAT_TYPES,
    NUMERIC_TYPES,
    SIGNED_TYPES,
    LegacyUnaryDescriptor,
    expect_dtype,
    expect_same_dtype,
    same_info_infer,
)
from flowrt.errors import ShapeError
from flowrt.types import Dim


def _consumed_inputs() -> Any:
    """The opset 1 ``consumed_inputs`` hint, accepted and ignored."""
    return attrs.field(default=None, converter=as_tuple)


def _nonzero(instance: object, attribute: attrs.Attribute, value: float) -> None:
    if value == 0:
        raise ValueError(f"{attribute.name!r} expects a nonzero value, got {value!r}")


def _alpha(descriptor: Any, constants: Sequence[Any]) -> tuple[float, float]:
    """``alpha`` from the descriptor, no ``beta``."""
    return float(descriptor.alpha), 0.0


def _alpha_beta(descriptor: Any, constants: Sequence[Any]) -> tuple[float, float]:
    return float(descriptor.alpha), float(descriptor.beta)


def _gelu_form(descriptor: Any) -> str:
    """Gelu's exact (erf) form is the plain one; "tanh" its approximation, a code of its own."""
    return "" if descriptor.approximate == "none" else descriptor.approximate


_float_infer = same_info_infer(FLOAT_TYPES)
layer_kind("Relu", LegacyUnaryDescriptor, activation=ActivationFact(1))(
    same_info_infer(FLOAT_TYPES | SIGNED_TYPES)
)
layer_kind("Sigmoid", LegacyUnaryDescriptor, activation=ActivationFact(4))(_float_infer)
layer_kind("Tanh", LegacyUnaryDescriptor, activation=ActivationFact(5))(_float_infer)
layer_kind("HardSwish", activation=ActivationFact(7, fused="curve"))(_float_infer)
layer_kind("Softplus", activation=ActivationFact(9, fused="never"))(_float_infer)
layer_kind("Mish", activation=ActivationFact(13, fused="never"))(_float_infer)
layer_kind("Softsign", activation=ActivationFact(14, fused="curve"))(_float_infer)


@attrs.frozen
class LeakyReluDescriptor:
    """LeakyRelu: ``alpha`` is the slope below zero."""

    alpha: float = 0.01
    consumed_inputs: tuple[int, ...] | None = _consumed_inputs()


@attrs.frozen
class EluDescriptor:
    """Elu: ``alpha * (exp(x) - 1)`` below zero."""

    alpha: float = 1.0
    consumed_inputs: tuple[int, ...] | None = _consumed_inputs()


@attrs.frozen
class CeluDescriptor:
    """Celu: ``alpha * (exp(x / alpha) - 1)`` below zero."""

    alpha: float = attrs.field(default=1.0, validator=_nonzero)


@attrs.frozen
class ThresholdedReluDescriptor:
    """ThresholdedRelu: x where x > ``alpha``, else 0."""

    alpha: float = 1.0


@attrs.frozen
class HardSigmoidDescriptor:
    """HardSigmoid: ``clip(alpha * x + beta, 0, 1)``."""

    alpha: float = 0.2
    beta: float = 0.5
    consumed_inputs: tuple[int, ...] | None = _consumed_inputs()


def _selu_default(alpha_1: float, alpha_6: float) -> Any:
    return attrs.Factory(lambda self: alpha_1 if self.opset < 6 else alpha_6, takes_self=True)


@attrs.frozen
class SeluDescriptor:
    """Selu: ``gamma * x`` above zero, ``gamma * alpha * (exp(x) - 1)`` below; opset 1 had
    rounder defaults than opset 6 on."""

    opset: int = 22
    alpha: float = _selu_default(1.6732, 1.67326319217681884765625)
    gamma: float = _selu_default(1.0507, 1.05070102214813232421875)
    consumed_inputs: tuple[int, ...] | None = _consumed_inputs()


@attrs.frozen
class GeluDescriptor:
    """Gelu: exact (``approximate`` "none", with erf) or the tanh approximation."""

    approximate: str = attrs.field(default="none", validator=attrs.validators.in_(("none", "tanh")))


_ACTIVATIONS_WITH_ATTRIBUTES: list[tuple[str, type, ActivationFact | None]] = [
    ("LeakyRelu", LeakyReluDescriptor, ActivationFact(2, _alpha)),
    ("Elu", EluDescriptor, ActivationFact(8, _alpha, fused="curve")),
    ("Celu", CeluDescriptor, None),
    ("ThresholdedRelu", ThresholdedReluDescriptor, None),
    ("HardSigmoid", HardSigmoidDescriptor, ActivationFact(6, _alpha_beta, fused="curve")),
    ("Selu", SeluDescriptor, None),
    ("Gelu", GeluDescriptor, ActivationFact(10, fused="curve", variants={"tanh": 11}, form=_gelu_form)),
]
for _kind, _desc, _fact in _ACTIVATIONS_WITH_ATTRIBUTES:
    layer_kind(_kind, _desc, activation=_fact)(_float_infer)


@attrs.frozen
class PReluDescriptor:
    """PRelu: ``slope * x`` below zero. From opset 7 the slope broadcasts to X like numpy;
    before, it is one value or one per channel (axis 1)."""

    consumed_inputs: tuple[int, ...] | None = _consumed_inputs()
    opset: int = 22


def prelu_slope_shape(x_shape: Sequence[Dim], slope_shape: Sequence[Dim], opset: int) -> tuple[Dim, ...]:
    """The shape to view the slope as so that numpy broadcasting applies it to X;
    ShapeError when it cannot apply without growing X."""
    x_shape, slope_shape = tuple(x_shape), tuple(slope_shape)
    if opset < 7 and len(slope_shape) == 1 and len(x_shape) >= 2 and slope_shape[0] != 1:
        if slope_shape[0] == x_shape[1] or not all(isinstance(d, int) for d in (slope_shape[0], x_shape[1])):
            return slope_shape + (1,) * (len(x_shape) - 2)
    if len(slope_shape) > len(x_shape):
        raise ShapeError(f"slope of shape {slope_shape} has a higher rank than X of shape {x_shape}")
    for x, s in zip(x_shape[::-1], slope_shape[::-1], strict=False):
        if isinstance(x, int) and isinstance(s, int) and s not in (1, x):
            raise ShapeError(f"slope of shape {slope_shape} does not broadcast to X of shape {x_shape}")
    return slope_shape


@layer_kind("PRelu", PReluDescriptor, min_inputs=2, max_inputs=2)
def infer_prelu(desc: PReluDescriptor, inputs, consts):
    x, slope = inputs
    expect_dtype(x, NUMERIC_TYPES, "X")
    expect_same_dtype([x, slope], "PRelu")
    if x.shape is not None and slope.shape is not None:
        prelu_slope_shape(x.shape, slope.shape, desc.opset)
    return [x]


@attrs.frozen
class ClipDescriptor:
    """Clip to [min, max]: attributes before opset 11 (unset: unbounded), optional scalar
    inputs from opset 11."""

    min: float | None = None
    max: float | None = None
    consumed_inputs: tuple[int, ...] | None = _consumed_inputs()
    opset: int = 22


def _clip_bounds(descriptor: ClipDescriptor, constants: Sequence[Any]) -> tuple[float, float] | None:
    """Clip's ``(min, max)``: the attributes before opset 11, else the constant inputs (absent:
    unbounded); None where a bound is not a constant, or (from constants alone) might not be."""
    bounds = list(constants[1:3]) + [None] * (3 - len(constants))
    if descriptor.opset < 11:
        bounds = [descriptor.min, descriptor.max]
    elif any(b is None for b in bounds[:2]) and len(constants) > 1:
        return None
    # .item(): a bound is one element, of shape () or (1,) alike (shape inference allows both)
    low, high = (
        np.inf * sign if b is None else float(np.asarray(b).item()) for b, sign in zip(bounds, (-1, 1))
    )
    return low, high


@layer_kind("Clip", ClipDescriptor, min_inputs=1, max_inputs=3, activation=ActivationFact(3, _clip_bounds))
def infer_clip(desc: ClipDescriptor, inputs, consts):
    x = inputs[0]
    expect_dtype(x, NUMERIC_TYPES, "input")
    for name, bound in zip(("min", "max"), inputs[1:], strict=False):
        if bound is None:
            continue
        expect_same_dtype([x, bound], f"Clip's input and {name}")
        if bound.is_static and bound.num_elements != 1:
            raise ShapeError(f"Clip's {name} expects a scalar, got shape {bound.format_shape()}")
    return [x]
