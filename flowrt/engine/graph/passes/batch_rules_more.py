"""Batching rules for joining, padding, resizing, slicing, expanding, per-sample normalization
and recurrent layers.

Registered beside those of ``batch_rules`` (same contract: a rule returns where the batch
leaves the layer, a :class:`Rewrite`, or raises :class:`Refused`). Their parameters (pads,
scales, sizes, slice bounds, target shapes) must be constants: a value computed at run time
could depend on the batch and is refused. A constant made for one sample (vit's class token,
an LSTM's zero initial state) is repeated for each of N samples.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from flowrt.engine.graph.graph import Graph, Layer, constant_value
from flowrt.engine.graph.layers.pad import pad_widths
from flowrt.engine.graph.layers.reshape import const_ints
from flowrt.engine.graph.layers.slice import slice_params
from flowrt.engine.graph.layers.tile import tile_repeats
from flowrt.engine.graph.passes.batch_rules import (
    Axes,
    Axis,
    Refused,
    Rewrite,
    batch_rule,
    batched_first,
    input_shape,
    not_along,
    replace_constant_input,
)
from flowrt.engine.graph.shapes import normalize_axis

# A Slice end at least this large keeps the whole axis whatever the batch (exporters write
# INT32_MAX or INT64_MAX); a start this negative clamps to 0.
WHOLE_AXIS = 2**31 - 1


def _given(layer: Layer, index: int) -> bool:
    return len(layer.inputs) > index and layer.inputs[index].source is not None


def _constant(layer: Layer, index: int, what: str) -> np.ndarray | None:
    """The value of optional input ``index`` (None when absent or empty); Refused when it is
    computed at run time."""
    if not _given(layer, index):
        return None
    value = constant_value(layer.inputs[index].source)
    if value is None:
        raise Refused(f"its {what} are computed at run time; only constant {what} are re-batched")
    return None if value.size == 0 else value


def _ints(layer: Layer, index: int, what: str) -> list[int] | None:
    return const_ints(_constant(layer, index, what))


def repeat_constants(
    layer: Layer, repeats: dict[int, int], names: dict[int, str] | None = None
) -> Callable[[Graph, int], str]:
    """A Rewrite's ``apply`` that feeds each input ``index`` of ``repeats`` (a constant made for
    one sample, 1 on the batch axis ``repeats[index]``) with that constant repeated N times:
    every sample then reads what the batch-1 network read."""

    def apply(graph: Graph, n: int) -> str:
        for index, at in repeats.items():
            constant = constant_value(layer.inputs[index].source)
            assert constant is not None  # repeats names constant inputs only
            value = np.repeat(constant, n, axis=at)
            replace_constant_input(graph, layer, index, value, f"batch_input{index}")
        shown = ", ".join((names or {}).get(i, f"input {i}") for i in repeats)
        return f"re-batched {layer.kind} {layer.name!r}: {shown} repeated for each of {n} samples"

    return apply


def _one_sample_constant(layer: Layer, index: int, at: int, what: str) -> None:
    """Refused unless input ``index`` is a constant with 1 on axis ``at`` (repeatable)."""
    if constant_value(layer.inputs[index].source) is None:
        raise Refused(f"{what} does not carry the batch and is computed at run time")
    shape = input_shape(layer, index)
    if len(shape) <= at or shape[at] != 1:
        raise Refused(f"{what} does not carry the batch and has shape {shape}; a 1 on axis {at} is expected")


# -- joining ------------------------------------------------------------------------------
@batch_rule("Concat")
def concat(layer: Layer, axes: list[Axis]) -> Axis | Rewrite:
    """Inputs that carry the batch carry it on one axis, not the one joined along; a constant
    input made for one sample (1 on the batch axis, as vit's class token) is repeated N times."""
    batched = {a for a in axes if a is not None}
    along = normalize_axis(layer.descriptor.concat_axis, len(input_shape(layer, 0)))
    if len(batched) != 1 or (None in axes and along in batched):
        raise Refused(f"every input must carry the batch on one axis, found axes {axes}")
    batch = batched.pop()
    not_along(batch, along, "along")
    repeats = {}
    for i, axis in enumerate(axes):
        if axis is None:
            _one_sample_constant(layer, i, batch, f"input {i}")
            repeats[i] = batch
    return Rewrite(batch, repeat_constants(layer, repeats)) if repeats else batch


# -- padding ------------------------------------------------------------------------------
@batch_rule("Pad")
def pad(layer: Layer, axes: list[Axis]) -> Axis:
    """The batch axis must get no pads at either end; pads, the constant value and the axes
    must not carry the batch (``batched_first``) and must be constants."""
    batch = batched_first(axes)
    pads = layer.descriptor.pads_attribute
    if pads is None:
        pads = _ints(layer, 1, "pads")
    chosen = _ints(layer, 3, "axes")
    if pads is None:
        raise Refused("it has no pads")
    widths = pad_widths(len(input_shape(layer, 0)), pads, chosen)
    if widths[batch] != (0, 0):
        raise Refused(f"it pads the batch axis {batch} by {widths[batch]}; (0, 0) is expected")
    return batch


# -- resizing -----------------------------------------------------------------------------
def _resized_axes(layer: Layer, rank: int) -> list[int]:
    given = getattr(layer.descriptor, "axes", None)
    return list(range(rank)) if given is None else [normalize_axis(a, rank, layer.kind) for a in given]


def _resize_sizes(layer: Layer, batch: int, at: int, sizes: list[int]) -> Rewrite:
    """Sizes that keep the batch at its dim of 1: rewritten to keep it at N."""
    if sizes[at] != 1:
        raise Refused(f"its sizes {sizes} resize the batch axis {batch} from 1 to {sizes[at]}")
    if layer.descriptor.keep_aspect_ratio_policy != "stretch":
        raise Refused(
            f"keep_aspect_ratio_policy {layer.descriptor.keep_aspect_ratio_policy!r} scales the batch "
            "axis with the others"
        )

    def apply(graph: Graph, n: int) -> str:
        new = [n if i == at else s for i, s in enumerate(sizes)]
        replace_constant_input(graph, layer, 3, np.asarray(new), "batch_sizes")
        return f"re-batched Resize {layer.name!r}: sizes {sizes} -> {new}"

    return Rewrite(batch, apply)


@batch_rule("Resize")
def resize(layer: Layer, axes: list[Axis]) -> Axis | Rewrite:
    """The batch axis must keep scale 1 and the whole roi, so that each output sample is read
    from its own input sample alone (both backends then leave that axis untouched); sizes
    that keep it at 1 are rewritten to N."""
    batch = batched_first(axes)
    legacy = layer.descriptor.legacy
    roi = None if legacy else _constant(layer, 1, "roi")
    scales = _constant(layer, 1 if legacy else 2, "scales")
    sizes = None if legacy else _ints(layer, 3, "sizes")
    resized = _resized_axes(layer, len(input_shape(layer, 0)))
    if batch not in resized:
        return batch
    at = resized.index(batch)
    if roi is not None:
        flat = [float(v) for v in roi.reshape(-1)]
        if (flat[at], flat[at + len(resized)]) != (0.0, 1.0):
            raise Refused(f"its roi {flat} crops the batch axis {batch}; (0, 1) is expected")
    if scales is not None:
        factors = [float(v) for v in scales.reshape(-1)]
        if factors[at] != 1.0:
            raise Refused(f"its scales {factors} scale the batch axis {batch}; 1 is expected")
        return batch
    if sizes is None:
        raise Refused("it has neither scales nor sizes")
    return _resize_sizes(layer, batch, at, sizes)


@batch_rule("Upsample")
def upsample(layer: Layer, axes: list[Axis]) -> Axis:
    """The batch axis must keep scale 1."""
    batch = batched_first(axes)
    factors = layer.descriptor.scale_values(_constant(layer, 1, "scales"))
    if factors is None:
        raise Refused("it has no scales")
    factors = [float(f) for f in factors]
    if factors[batch] != 1.0:
        raise Refused(f"its scales {factors} scale the batch axis {batch}; 1 is expected")
    return batch


# -- slicing ------------------------------------------------------------------------------
@batch_rule("Slice")
def slice_(layer: Layer, axes: list[Axis]) -> Axis:
    """A slice that leaves the batch axis out of its axes, or takes all of it (start clamped to
    0, end past any batch, step 1): each sample keeps its place."""
    batch = batched_first(axes)
    rank = len(input_shape(layer, 0))
    values = [_ints(layer, i, what) for i, what in enumerate(("starts", "ends", "axes", "steps"), 1)]
    params = slice_params(layer.descriptor, values)
    if params is None:
        raise Refused("its starts and ends are not known")
    for start, end, axis, step in zip(*params, strict=True):
        if normalize_axis(axis, rank) != batch:
            continue
        if step != 1 or not (start == 0 or start <= -WHOLE_AXIS) or end < WHOLE_AXIS:
            raise Refused(
                f"it slices the batch axis {batch} as [{start}:{end}:{step}]; only the whole axis "
                f"([0:{WHOLE_AXIS}:1] or wider) keeps every sample"
            )
    return batch


# -- per-sample normalization -------------------------------------------------------------
@batch_rule("MeanVarianceNormalization")
def mean_variance_norm(layer: Layer, axes: list[Axis]) -> Axis:
    """Each sample alone only when the normalized axes leave out the batch (the default
    (0, 2, 3) does not)."""
    batch = batched_first(axes)
    rank = len(input_shape(layer, 0))
    normalized = sorted({normalize_axis(a, rank, layer.kind) for a in layer.descriptor.axes})
    if batch in normalized:
        raise Refused(f"it normalizes over axes {normalized}, which include the batch axis {batch}")
    return batch


# -- recurrent layers ---------------------------------------------------------------------
# Inputs of RNN, GRU and LSTM: X, W, R, B, sequence_lens, initial_h, initial_c, P.
_WEIGHTS = {1: "W", 2: "R", 3: "B", 7: "P"}
_STATES = {4: "sequence_lens", 5: "initial_h", 6: "initial_c"}


def _recurrent_axes(layout: int) -> tuple[int, int, int]:
    """(batch axis of X, of the states initial_h/c, Y_h and Y_c, of Y)."""
    return (0, 0, 0) if layout else (1, 1, 2)


def _repeated_states(layer: Layer, axes: list[Axis], state_axis: int) -> dict[int, int]:
    """Per state input given that does not carry the batch: the axis along which its batch-1
    constant is repeated N times (each sample starts from the same state)."""
    repeats = {}
    for index, what in _STATES.items():
        if not _given(layer, index):
            continue
        at = 0 if index == 4 else state_axis
        if axes[index] is None:
            _one_sample_constant(layer, index, at, what)
            repeats[index] = at
        elif axes[index] != at:
            raise Refused(f"{what} carries the batch on axis {axes[index]}; axis {at} is expected")
    return repeats


@batch_rule("RNN", "GRU", "LSTM")
def recurrent(layer: Layer, axes: list[Axis]) -> Axes | Rewrite:
    """Each sample runs its own recurrence: X carries the batch on axis 1 (layout 0) or 0
    (layout 1), the states on axis 1 or 0, Y on axis 2 or 0; the weights may not carry it.
    Constant initial states (and sequence_lens) made for one sample are repeated N times."""
    x_axis, state_axis, y_axis = _recurrent_axes(layer.descriptor.layout)
    if axes[0] != x_axis:
        found = "does not carry the batch" if axes[0] is None else f"carries the batch on axis {axes[0]}"
        raise Refused(f"X {found}; axis {x_axis} is expected (layout {layer.descriptor.layout})")
    for index, what in _WEIGHTS.items():
        if index < len(axes) and axes[index] is not None:
            raise Refused(f"its weights {what} carry the batch")
    repeats = _repeated_states(layer, axes, state_axis)
    out: Axes = (y_axis, state_axis, state_axis)[: len(layer.outputs)]
    return Rewrite(out, repeat_constants(layer, repeats, _STATES)) if repeats else out


# -- broadcasting to a shape --------------------------------------------------------------
@batch_rule("Expand")
def expand(layer: Layer, axes: list[Axis]) -> Axis:
    """The target shape must have 1 (or no dim) on the batch axis, so that it keeps the batch."""
    batch = batched_first(axes)
    target = _ints(layer, 1, "target shape")
    if target is None:
        raise Refused("it has no target shape")
    rank = len(input_shape(layer, 0))
    out_rank = max(rank, len(target))
    axis = batch + out_rank - rank
    at = axis - (out_rank - len(target))
    if at >= 0 and target[at] != 1:
        raise Refused(f"its target shape {target} has {target[at]} on the batch axis {axis}; 1 is expected")
    return axis


@batch_rule("Tile")
def tile(layer: Layer, axes: list[Axis]) -> Axis:
    """The batch axis must be repeated once."""
    batch = batched_first(axes)
    repeats = _ints(layer, 1, "repeats")
    along = _ints(layer, 2, "axis")
    if repeats is None:
        raise Refused("it has no repeats")
    counts = tile_repeats(len(input_shape(layer, 0)), repeats, along[0] if along else None)
    if counts[batch] != 1:
        raise Refused(f"it repeats the batch axis {batch} {counts[batch]} times; 1 is expected")
    return batch
