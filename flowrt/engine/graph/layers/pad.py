"""Pad: grow (or, with negative pads, crop) a tensor at the start and end of its axes."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal, get_args

import attrs

from flowrt.engine.graph.layer_kind import as_tuple, layer_kind
from flowrt.engine.graph.layers.reshape import const_ints
from flowrt.engine.graph.shapes import normalize_axis
from flowrt.errors import ShapeError
from flowrt.types import Dim, TensorInfo

PadMode = Literal["constant", "reflect", "edge", "wrap"]
PAD_MODES: tuple[PadMode, ...] = get_args(PadMode)


@attrs.frozen
class PadDescriptor:
    """Pad: ``pads`` (``paddings`` in opset 1) and ``value`` are attributes before opset 11;
    from opset 11 pads, the constant value and (opset 18) axes are inputs. ``pads`` lists
    every axis's begin count, then every axis's end count."""

    mode: PadMode = attrs.field(default="constant", validator=attrs.validators.in_(PAD_MODES))
    pads: tuple[int, ...] | None = attrs.field(default=None, converter=as_tuple)
    paddings: tuple[int, ...] | None = attrs.field(default=None, converter=as_tuple)
    value: float = 0.0

    @property
    def pads_attribute(self) -> tuple[int, ...] | None:
        return self.pads if self.pads is not None else self.paddings


def pad_widths(rank: int, pads: Sequence[int], axes: Sequence[int] | None) -> list[tuple[int, int]]:
    """(begin, end) per axis of a rank-``rank`` tensor; ShapeError when pads and axes disagree."""
    chosen = list(range(rank)) if axes is None else [normalize_axis(a, rank, "Pad") for a in axes]
    if len(pads) != 2 * len(chosen):
        raise ShapeError(f"Pad: {2 * len(chosen)} pads expected for {len(chosen)} axes, got {list(pads)}")
    widths = [(0, 0)] * rank
    for i, axis in enumerate(chosen):
        widths[axis] = (pads[i], pads[len(chosen) + i])
    return widths


def _padded(d: Dim, begin: int, end: int) -> Dim:
    if begin == end == 0:
        return d
    if not isinstance(d, int):
        return None
    if d + begin + end < 0:
        raise ShapeError(f"Pad: pads ({begin}, {end}) crop more than the dim {d}")
    return d + begin + end


@layer_kind("Pad", PadDescriptor, min_inputs=1, max_inputs=4)
def infer_pad(desc: PadDescriptor, inputs, consts):
    data = inputs[0]
    if data.shape is None:
        return [TensorInfo(None, data.dtype)]
    rank = len(data.shape)
    has_axes = len(inputs) > 3 and inputs[3] is not None
    axes = const_ints(consts[3]) if has_axes else None
    if desc.pads_attribute is not None:
        pads: list[int] | None = list(desc.pads_attribute)
    elif len(inputs) > 1 and inputs[1] is not None:
        pads = const_ints(consts[1])
    else:
        raise ShapeError("Pad: pads expected (attribute before opset 11, input after), found none")
    if pads is None or (has_axes and axes is None):
        padded = set(range(rank)) if axes is None else {normalize_axis(a, rank, "Pad") for a in axes}
        return [TensorInfo(tuple(None if i in padded else d for i, d in enumerate(data.shape)), data.dtype)]
    widths = pad_widths(rank, pads, axes)
    return [
        TensorInfo(tuple(_padded(d, b, e) for d, (b, e) in zip(data.shape, widths, strict=True)), data.dtype)
    ]
