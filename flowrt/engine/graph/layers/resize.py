"""Resize and Upsample: layers that rescale the spatial (or any) dims of a tensor."""

from __future__ import annotations

from collections.abc import Sequence

import attrs
import numpy as np

from flowrt.engine.graph.layer_kind import as_tuple, layer_kind
from flowrt.engine.graph.shapes import normalize_axis
from flowrt.errors import ShapeError
from flowrt.types import Dim, TensorInfo

_in = attrs.validators.in_
COORDINATE_MODES = (
    "half_pixel",
    "half_pixel_symmetric",
    "pytorch_half_pixel",
    "align_corners",
    "asymmetric",
    "tf_crop_and_resize",
)
NEAREST_MODES = ("round_prefer_floor", "round_prefer_ceil", "floor", "ceil")


@attrs.frozen
class ResizeDescriptor:
    """Resize. Opset 10 takes (X, scales) and maps coordinates as Upsample does (asymmetric,
    nearest rounds down when upsampling); from opset 11 it takes (X, roi, scales, sizes) and
    the attributes below; ``axes``, ``antialias`` and ``keep_aspect_ratio_policy`` are opset 18's."""

    mode: str = attrs.field(default="nearest", validator=_in(("nearest", "linear", "cubic")))
    coordinate_transformation_mode: str = attrs.field(default="half_pixel", validator=_in(COORDINATE_MODES))
    cubic_coeff_a: float = -0.75
    exclude_outside: int = 0
    extrapolation_value: float = 0.0
    nearest_mode: str = attrs.field(default="round_prefer_floor", validator=_in(NEAREST_MODES))
    antialias: int = 0
    axes: tuple[int, ...] | None = attrs.field(default=None, converter=as_tuple)
    keep_aspect_ratio_policy: str = attrs.field(
        default="stretch", validator=_in(("stretch", "not_larger", "not_smaller"))
    )
    opset: int = 22

    @property
    def legacy(self) -> bool:
        """True for opset 10's (and Upsample's) coordinate mapping."""
        return self.opset < 11


def _given(value: np.ndarray | None) -> np.ndarray | None:
    """An optional input's value; an empty tensor counts as absent, as ONNX says."""
    return None if value is None or np.asarray(value).size == 0 else np.asarray(value)


def resize_inputs(desc: ResizeDescriptor, args: Sequence[np.ndarray | None]):
    """(roi, scales, sizes) from the inputs after X: (scales) in opset 10, (roi, scales, sizes) after."""
    args = list(args) + [None] * (3 - len(args))
    if desc.legacy:
        return None, _given(args[0]), None
    return _given(args[0]), _given(args[1]), _given(args[2])


def _expand(values: Sequence, axes: list[int], rank: int, fill: Sequence) -> list:
    """Values given per axis in ``axes`` spread over all ``rank`` dims, ``fill`` elsewhere."""
    if len(values) != len(axes):
        raise ShapeError(f"Resize: {len(axes)} values expected (one per axis), got {len(values)}")
    out = list(fill)
    for v, a in zip(values, axes, strict=True):
        out[a] = v
    return out


def resize_plan(desc: ResizeDescriptor, shape: Sequence[Dim], roi, scales, sizes):
    """(output dims, scale per dim, roi over all dims or None) for an input of ``shape``.

    Dims may be unknown; the output dims are then None where they cannot be known.
    """
    rank = len(shape)
    axes = list(range(rank)) if desc.axes is None else [normalize_axis(a, rank, "Resize") for a in desc.axes]
    if len(set(axes)) != len(axes):
        raise ShapeError(f"Resize: axes must be unique, got {list(desc.axes or ())}")
    if roi is not None:
        # Numpy scalars, not floats: the coordinate mapping then rounds as onnx's reference does.
        flat = list(np.asarray(roi).reshape(-1))
        n = len(axes)
        roi = _expand(flat[:n], axes, rank, [0.0] * rank) + _expand(flat[n:], axes, rank, [1.0] * rank)
    if (scales is None) == (sizes is None):
        raise ShapeError("Resize: exactly one of scales and sizes expected")
    if scales is not None:
        factors = _expand([float(s) for s in np.asarray(scales).reshape(-1)], axes, rank, [1.0] * rank)
        if any(f <= 0 for f in factors):
            raise ShapeError(f"Resize: scales must be > 0, got {factors}")
        out = [_scaled(d, f) for d, f in zip(shape, factors, strict=True)]
        return out, factors, roi
    targets = _expand([int(s) for s in np.asarray(sizes).reshape(-1)], axes, rank, shape)
    if desc.keep_aspect_ratio_policy == "stretch":
        factors = [t / d if isinstance(d, int) and d else 1.0 for t, d in zip(targets, shape, strict=True)]
        return targets, factors, roi
    ratios = [targets[a] / shape[a] for a in axes if isinstance(shape[a], int) and shape[a]]
    if len(ratios) < len(axes):
        return [None if i in axes else d for i, d in enumerate(shape)], [1.0] * rank, roi
    scale = min(ratios) if desc.keep_aspect_ratio_policy == "not_larger" else max(ratios)
    out = [int(scale * d + 0.5) if i in axes else d for i, d in enumerate(shape)]  # round half up
    return out, [scale if i in axes else 1.0 for i in range(rank)], roi


def _scaled(dim: Dim, factor: float) -> Dim:
    if factor == 1.0:
        return dim
    return int(np.floor(dim * factor)) if isinstance(dim, int) else None


@layer_kind("Resize", ResizeDescriptor, min_inputs=1, max_inputs=4)
def infer_resize(desc: ResizeDescriptor, inputs, consts):
    data = inputs[0]
    if data.shape is None:
        return [TensorInfo(None, data.dtype)]
    roi, scales, sizes = resize_inputs(desc, consts[1:])
    slots = (1,) if desc.legacy else (2, 3)
    if any(i < len(inputs) and inputs[i] is not None and consts[i] is None for i in slots):
        # The scales or sizes are computed at run time: only the rank is known.
        return [TensorInfo((None,) * len(data.shape), data.dtype)]
    out, _, _ = resize_plan(desc, data.shape, roi, scales, sizes)
    return [TensorInfo(tuple(out), data.dtype)]


@attrs.frozen
class UpsampleDescriptor:
    """Upsample (opset 1-9): scales per dim from the ``scales`` attribute (opset 7), the second
    input (opset 9), or ``height_scale``/``width_scale`` of an NCHW input (opset 1)."""

    mode: str = attrs.field(default="nearest", validator=_in(("nearest", "linear", "bilinear")))
    scales: tuple[float, ...] | None = attrs.field(default=None, converter=as_tuple)
    height_scale: float | None = None
    width_scale: float | None = None

    def as_resize(self) -> ResizeDescriptor:
        """The opset-10 Resize that computes the same thing."""
        return ResizeDescriptor(mode="nearest" if self.mode == "nearest" else "linear", opset=10)

    def scale_values(self, scales_input: np.ndarray | None) -> list[float] | None:
        if self.scales is not None:
            return list(self.scales)
        if self.height_scale is not None or self.width_scale is not None:
            return [1.0, 1.0, self.height_scale or 1.0, self.width_scale or 1.0]
        return None if scales_input is None else [float(s) for s in np.asarray(scales_input).reshape(-1)]


@layer_kind("Upsample", UpsampleDescriptor, min_inputs=1, max_inputs=2)
def infer_upsample(desc: UpsampleDescriptor, inputs, consts):
    data = inputs[0]
    scales = desc.scale_values(consts[1] if len(consts) > 1 else None)
    if data.shape is None:
        return [TensorInfo(None if scales is None else (None,) * len(scales), data.dtype)]
    if scales is None:
        if len(inputs) < 2 or inputs[1] is None:
            raise ShapeError("Upsample: scales expected (attribute or second input), found none")
        return [TensorInfo((None,) * len(data.shape), data.dtype)]
    if len(scales) != len(data.shape):
        raise ShapeError(f"Upsample: one scale per dim expected for {data.format_shape()}, got {scales}")
    return [TensorInfo(tuple(_scaled(d, s) for d, s in zip(data.shape, scales, strict=True)), data.dtype)]
