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

import math

import attrs
import numpy as np

from flowrt.engine.graph.graph import Graph, Layer, constant_value
from flowrt.engine.graph.layers.reshape import const_ints
from flowrt.engine.graph.passes.batch_rules import (
    Axis,
    Refused,
    Rewrite,
    batch_rule,
    batched_first,
    input_shape,
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


@batch_rule("Reshape")
def reshape(layer: Layer, axes: list[Axis]) -> Axis | Rewrite:
    """Provable when the dims before the batch's axis hold the same number of elements before
    and after (a Reshape regroups elements in order, so each outer block keeps the samples'
    parts in turn): the batch is then on the output axis :func:`_output_axis` finds, holding
    the size it has at batch 1 for each sample. Its target entry is rewritten to N times
    that, unless it is -1 (inferred) or 0 copying the input's batch axis of the same size."""
    batch = batched_first(axes)
    target, from_input = _target(layer)
    info = layer.outputs[0].info
    if info is None or info.shape is None:
        raise Refused("its output shape is not known")
    given, produced = input_shape(layer, 0), tuple(info.shape)
    if not all(isinstance(d, int) and d > 0 for d in (*given, *produced)):
        raise Refused(f"its shapes {given} -> {produced} are not all known and non-empty")
    source, out = static_dims(given), static_dims(produced)
    at = _output_axis(source, batch, out)
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


def _retarget(graph: Graph, layer: Layer, target: list[int], from_input: bool, axis: int, size: int) -> str:
    new = [size if i == axis else t for i, t in enumerate(target)]
    if from_input:
        replace_constant_input(graph, layer, 1, np.asarray(new), "batch_shape")
    else:
        layer.descriptor = attrs.evolve(layer.descriptor, shape=tuple(new))
    return f"re-batched Reshape {layer.name!r}: target {target} -> {new}"
