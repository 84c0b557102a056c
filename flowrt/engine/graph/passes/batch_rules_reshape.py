"""The batching rule of Reshape, which may fold the batch into an axis and unfold it again.

The batch's axis need not hold 1 at batch 1: a Reshape may fold each sample's rows into it
(gpt2's ``[-1, 256]`` turns (1, 128, 256) into (128, 256): at batch N, (N * 128, 256)), or its
heads (vit's attention: (197, 1, 256) into (197, 4, 64)). The batch is then on that axis,
sample-major: each sample's k elements along it (k: its size at batch 1) follow the last
sample's. The layers between treat each of those k as their own row or image, which keeps
samples apart exactly when they kept the k apart at batch 1 (a layer whose rule works along
the batch axis, or reduces it, is refused anyway); a later Reshape unfolds them. Registered
beside ``batch_rules`` (same contract); ``check_output`` wants outputs unfolded.
"""

from __future__ import annotations

import functools
import math

import attrs
import numpy as np

from flowrt.engine.graph.graph import Graph, Layer, constant_value
from flowrt.engine.graph.layers.reshape import const_ints
from flowrt.engine.graph.passes.batch_rules import (
    Axis,
    Carried,
    Interleaved,
    Refused,
    Rewrite,
    batch_rule,
    batched_first,
    input_shape,
    only_batched,
    replace_constant_input,
)
from flowrt.types import static_dims


def _target(layer: Layer) -> tuple[list[int], bool]:
    """The target shape as given, and whether it is an input (else the descriptor's)."""
    if len(layer.inputs) > 1 and layer.inputs[1].source is not None:
        target = const_ints(constant_value(layer.inputs[1].source))
        if target is None:
            raise Refused("its target shape is computed at run time; only a constant target is re-batched")
        return target, True
    return list(layer.descriptor.shape or ()), False


def _output_axis(source: tuple[int, ...], batch: int, out: tuple[int, ...]) -> int | None:
    """Where the batch lands in ``out``: an axis after dims holding as many elements as those
    before ``batch`` do in ``source`` (the same outer blocks, each holding every sample's part
    in turn). Where several qualify (dims of 1 between them), the input's own axis when it
    qualifies with a 1 (the batch stays where it was), else the first that is 1 (unfolded),
    else the first one (folded)."""
    outer = math.prod(source[:batch])
    found = [b for b in range(len(out)) if math.prod(out[:b]) == outer]
    if not found:
        return None
    if batch in found and out[batch] == 1 and out[:batch] == source[:batch]:
        return batch
    return next((b for b in found if out[b] == 1), found[0])


def _interleaving_axis(source: tuple[int, ...], batch: int, out: tuple[int, ...]) -> tuple[int, int] | None:
    """Where the batch of ``source`` (on axis ``batch``, its samples' parts one after the
    other) lands in ``out`` interleaved (:class:`Interleaved`): an axis whose blocks hold
    each sample's part in turn, the dims before it taking the outer blocks of ``source``
    and those after it a whole part. (The axis, the elements of a part along it), or None."""
    outer, part = math.prod(source[:batch]), math.prod(source[batch:])
    for a in range(len(out) - 1):
        trailing = math.prod(out[a + 1 :])
        inner, rest = divmod(part, trailing)
        if not rest and inner and out[a] % inner == 0 and math.prod(out[:a]) * (out[a] // inner) == outer:
            return a, inner
    return None


def _unfold(
    layer: Layer, given: Interleaved, target: list[int], from_input: bool, out: tuple[int, ...]
) -> Axis | Rewrite:
    """A Reshape of an input whose batch is interleaved into ``out``: provable where an output
    axis of 1 takes the batch between the outer blocks (the dims before it) and the samples'
    parts (the dims after it); it becomes that axis, one sample per row, rewritten to N."""
    source = static_dims(input_shape(layer, 0))
    if len(target) != len(out) or (given.axis < len(target) and target[given.axis] == 0):
        raise Refused(f"its target {list(target)} copies the axis the batch is interleaved on")
    outer = math.prod(source[: given.axis]) * (source[given.axis] // given.inner)
    part = given.inner * math.prod(source[given.axis + 1 :])
    for b, size in enumerate(out):
        if size == 1 and math.prod(out[:b]) == outer and math.prod(out[b + 1 :]) == part:
            if target[b] == -1:
                return b
            if target[b] != 1:
                break
            return Rewrite(b, functools.partial(_retarget_to, layer, target, from_input, b))
    raise Refused(
        f"its input carries the batch interleaved on axis {given.axis} of {source}, and its target "
        f"{list(target)} gives the samples no axis of their own"
    )


@batch_rule("Reshape")
def reshape(layer: Layer, axes: list[Axis]) -> Carried | Rewrite:
    """Provable when the dims before the batch's axis hold the same number of elements before
    and after (a Reshape regroups elements in order, so each outer block keeps the samples'
    parts in turn): the batch is then on the output axis :func:`_output_axis` finds, holding
    the size it has at batch 1 for each sample. Its target entry is rewritten to N times
    that, unless it is -1 (inferred) or 0 copying the input's batch axis of the same size."""
    target, from_input = _target(layer)
    info = layer.outputs[0].info
    if info is None or info.shape is None:
        raise Refused("its output shape is not known")
    given, produced = input_shape(layer, 0), tuple(info.shape)
    if not all(isinstance(d, int) and d > 0 for d in (*given, *produced)):
        raise Refused(f"its shapes {given} -> {produced} are not all known and non-empty")
    if isinstance(axes[0], Interleaved):
        only_batched(axes, 0)
        return _unfold(layer, axes[0], target, from_input, static_dims(produced))
    batch = batched_first(axes)
    source, out = static_dims(given), static_dims(produced)
    at = _output_axis(source, batch, out)
    woven = _interleaving_axis(source, batch, out)
    keeps = len(target) == len(out) and not (batch < len(target) and target[batch] == 0)
    if at == len(out) - 1 and len(out) > 1 and woven is not None and keeps and target[woven[0]] != 0:
        # folded into the last axis, the samples would meet in whatever works along it (a
        # Gemm's dot products); interleaved into the rows before it, they stay apart
        a, inner = woven
        if target[a] == -1:
            return Interleaved(a, inner)
        return Rewrite(
            Interleaved(a, inner),
            lambda graph, n: _retarget(graph, layer, target, from_input, a, n * out[a]),
        )
    if at is None or len(target) != len(out):
        raise Refused(
            f"its target {list(target)} regroups the dims before the batch axis {batch}: {source} becomes {out}"
        )
    copies = [i for i, t in enumerate(target) if t == 0 and i == batch]
    if copies and at != batch:
        raise Refused(
            f"its target {list(target)} copies the batch axis {batch} to another place than axis {at}"
        )
    if target[at] == -1 or (target[at] == 0 and source[batch] == out[at]):
        return at
    if target[at] == 0:
        raise Refused(
            f"its target {list(target)} copies axis {at} of {source}, which is not the batch's {out[at]}"
        )
    return Rewrite(at, lambda graph, n: _retarget(graph, layer, target, from_input, at, n * out[at]))


def _retarget_to(
    layer: Layer, target: list[int], from_input: bool, axis: int, graph: Graph, batch: int
) -> str:
    """:func:`_retarget` of ``axis`` to the batch (an axis of one sample per row)."""
    return _retarget(graph, layer, target, from_input, axis, batch)


def _retarget(graph: Graph, layer: Layer, target: list[int], from_input: bool, axis: int, size: int) -> str:
    new = [size if i == axis else t for i, t in enumerate(target)]
    if from_input:
        replace_constant_input(graph, layer, 1, np.asarray(new), "batch_shape")
    else:
        layer.descriptor = attrs.evolve(layer.descriptor, shape=tuple(new))
    return f"re-batched Reshape {layer.name!r}: target {target} -> {new}"
