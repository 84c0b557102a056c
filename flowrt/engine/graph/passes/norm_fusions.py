"""Normalizations written out of small ops, found and offered as one layer (as ONNX Runtime's
LayerNormFusion and SimplifiedLayerNormFusion):

- ``ReduceMean -> Sub -> Pow 2 (or Mul by itself) -> ReduceMean -> Add eps -> Sqrt -> Div ->
  Mul gamma [-> Add beta]`` -> LayerNormalization, as older exporters write torch's LayerNorm;
- ``x * 1 / sqrt(mean(x^2) + eps) * gamma`` (T5, LLaMA: Sqrt then Reciprocal or Div, or a
  Div by the Sqrt) -> RMSNormalization.

Both are ``u * gamma / sqrt(mean(u^2) + eps)`` with the means over trailing dims, read as a
:class:`Monomial`; when ``u`` is ``x - mean(x)`` over the same dims it is a
LayerNormalization of x, else an RMSNormalization of u. The fused layer needs gamma (both
kinds take a scale input), so a norm without one is left alone.
"""

from __future__ import annotations

import attrs

from flowrt.engine.graph.graph import Layer, OutputSlot, constant_value
from flowrt.engine.graph.layers.normalization import LayerNormalizationDescriptor, RMSNormalizationDescriptor
from flowrt.engine.graph.layers.reduce import reduce_axes
from flowrt.engine.graph.layers.reshape import const_ints
from flowrt.engine.graph.passes.fusions import Fusion
from flowrt.engine.graph.passes.pattern_match import accept, close, monomial, producer, scalar, sources
from flowrt.errors import FlowrtError
from flowrt.registry import ReplacementLayer
from flowrt.types import DataType


@attrs.frozen
class _Normalized:
    """``u * gamma / sqrt(mean(u^2) + epsilon)``, the mean over the dims from ``axis`` on."""

    u: OutputSlot
    gamma: OutputSlot
    epsilon: float
    axis: int
    layers: tuple[Layer, ...]


def _trailing_mean(slot: OutputSlot | None, members: set[str]) -> tuple[Layer, OutputSlot, int] | None:
    """(the ReduceMean, its data input, the first reduced axis) when ``slot`` is a mean over
    the trailing dims from some axis on, with the dims kept."""
    layer = producer(slot, members, "ReduceMean")
    if layer is None or not layer.descriptor.keepdims:
        return None
    data, axes_slot = (sources(layer) + [None])[:2]
    axes_value = const_ints(constant_value(axes_slot))
    if (
        data is None
        or data.info is None
        or data.info.rank is None
        or (axes_slot is not None and axes_value is None)
    ):
        return None
    try:
        axes = reduce_axes(layer.descriptor, data.info.rank, axes_value)
    except FlowrtError:
        return None
    if not axes or axes != tuple(range(axes[0], data.info.rank)):
        return None
    return layer, data, axes[0]


def _root_mean_square(
    slot: OutputSlot, members: set[str]
) -> tuple[tuple[Layer, ...], OutputSlot, float, int] | None:
    """(its layers, u, epsilon, axis) when ``slot`` is ``sqrt(mean(u^2) + epsilon)``."""
    root = producer(slot, members, "Sqrt")
    add = producer(sources(root)[0], members, "Add") if root is not None else None
    if root is None or add is None or len(add.inputs) != 2:
        return None
    for variance, eps in (sources(add), sources(add)[::-1]):
        epsilon = scalar(eps)
        mean = _trailing_mean(variance, members) if epsilon is not None else None
        if epsilon is None or mean is None:
            continue
        square = monomial(mean[1], members)
        if square.num and square.is_power(square.num[0], 2):
            return (*square.layers, mean[0], add, root), square.num[0], epsilon, mean[2]
    return None


def _normalized(root: Layer | None, members: set[str]) -> _Normalized | None:
    """What ``root`` (a Mul or Div) computes, when it is ``u * gamma / sqrt(mean(u^2) + eps)``."""
    if root is None or root.kind not in ("Mul", "Div"):
        return None
    product = monomial(root.outputs[0], members)
    if len(product.num) != 2 or len(product.den) != 1 or not close(product.scale, 1.0):
        return None
    found = _root_mean_square(product.den[0], members)
    if found is None:
        return None
    layers, u, epsilon, axis = found
    a, b = product.num
    gamma = b if a is u else a if b is u else None
    if gamma is None:
        return None
    return _Normalized(u, gamma, epsilon, axis, (*layers, *product.layers))


def _centered(found: _Normalized, members: set[str]) -> tuple[tuple[Layer, Layer], OutputSlot] | None:
    """((the ReduceMean, the Sub), x) when u is ``x - mean(x)`` over the normalized dims."""
    sub = producer(found.u, members, "Sub")
    if sub is None:
        return None
    x, mean_slot = sources(sub)
    mean = _trailing_mean(mean_slot, members)
    if mean is None or mean[1] is not x or mean[2] != found.axis:
        return None
    return (mean[0], sub), mean[1]  # x itself, read by the mean


def _fits(param: OutputSlot | None, x: OutputSlot, axis: int) -> bool:
    """Whether a scale or bias is float32 and broadcasts to X's dims from ``axis`` on (what
    the fused kernels take)."""
    if (
        param is None
        or param.info is None
        or param.info.shape is None
        or param.info.dtype is not DataType.FLOAT32
    ):
        return False
    if x.info is None or x.info.shape is None:
        return False
    shape, normalized = param.info.shape, x.info.shape[axis:]
    return len(shape) <= len(normalized) and all(
        p == 1 or p == d for p, d in zip(reversed(shape), reversed(normalized), strict=False)
    )


def _layer_norm(
    found: _Normalized, x: OutputSlot, beta: OutputSlot | None, name: str
) -> ReplacementLayer | None:
    """The LayerNormalization of x by ``found``'s gamma (and ``beta``), when they fit."""
    if not _fits(found.gamma, x, found.axis) or (beta is not None and not _fits(beta, x, found.axis)):
        return None
    assert x.info is not None and x.info.shape is not None  # _fits found them
    rank = len(x.info.shape)
    descriptor = LayerNormalizationDescriptor(axis=found.axis - rank, epsilon=found.epsilon)
    inputs = (x, found.gamma) if beta is None else (x, found.gamma, beta)
    return ReplacementLayer("LayerNormalization", descriptor, inputs, None, name)


def layer_norm_with_bias(layer: Layer, members: set[str]) -> Fusion | None:
    """The written-out LayerNormalization, then ``Add`` beta -> LayerNormalization with bias."""
    if layer.kind != "Add" or len(layer.inputs) != 2 or getattr(layer.descriptor, "legacy", False):
        return None
    for y, beta in (sources(layer), sources(layer)[::-1]):
        found = _normalized(producer(y, members, "Mul", "Div"), members)
        centered = _centered(found, members) if found is not None else None
        if found is None or centered is None:
            continue
        replacement = _layer_norm(found, centered[1], beta, layer.name)
        if replacement is not None:
            return accept([*centered[0], *found.layers, layer], layer, replacement, members)
    return None


def normalization(layer: Layer, members: set[str]) -> Fusion | None:
    """``u * gamma / sqrt(mean(u^2) + eps)`` computed by ``layer`` -> LayerNormalization (no
    bias) when u is ``x - mean(x)``, else RMSNormalization of u."""
    found = _normalized(layer, members)
    if found is None:
        return None
    centered = _centered(found, members)
    if centered is not None:
        replacement = _layer_norm(found, centered[1], None, layer.name)
        fusion = accept([*centered[0], *found.layers], layer, replacement, members) if replacement else None
        if fusion is not None:
            return fusion
    # Also when x - mean(x) is read elsewhere: the RMS of u, the Sub and its mean left in place.
    if not _fits(found.gamma, found.u, found.axis):
        return None
    assert found.u.info is not None and found.u.info.shape is not None  # _fits found them
    rank = len(found.u.info.shape)
    descriptor = RMSNormalizationDescriptor(axis=found.axis - rank, epsilon=found.epsilon)
    replacement = ReplacementLayer("RMSNormalization", descriptor, (found.u, found.gamma), None, layer.name)
    return accept(found.layers, layer, replacement, members)
