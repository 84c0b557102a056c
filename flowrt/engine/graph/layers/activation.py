"""Activation layers: Relu and its relatives, sigmoid-like curves, Gelu, PRelu and Clip.

Each keeps its input's shape and dtype. Attribute defaults are ONNX's; Selu's changed at
opset 6 and Clip's bounds moved from attributes to optional inputs at opset 11.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import attrs

from flowrt.engine.graph.layer_kind import as_tuple, layer_kind
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


layer_kind("Relu", LegacyUnaryDescriptor)(same_info_infer(FLOAT_TYPES | SIGNED_TYPES))
layer_kind(["Sigmoid", "Tanh"], LegacyUnaryDescriptor)(same_info_infer(FLOAT_TYPES))
layer_kind(["Softplus", "Softsign", "HardSwish", "Mish"])(same_info_infer(FLOAT_TYPES))


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


def _selu_default(alpha_1: float, alpha_6: float) -> attrs.Factory:
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


_float_infer = same_info_infer(FLOAT_TYPES)
for _kind, _desc in [
    ("LeakyRelu", LeakyReluDescriptor),
    ("Elu", EluDescriptor),
    ("Celu", CeluDescriptor),
    ("ThresholdedRelu", ThresholdedReluDescriptor),
    ("HardSigmoid", HardSigmoidDescriptor),
    ("Selu", SeluDescriptor),
    ("Gelu", GeluDescriptor),
]:
    layer_kind(_kind, _desc)(_float_infer)


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


@layer_kind("Clip", ClipDescriptor, min_inputs=1, max_inputs=3)
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
