"""Turn per-channel Mul and Add by constants into one inference BatchNormalization.

Models exported from frameworks that fold batch norm into ``x * scale + shift`` (Caffe2's
SpatialBN, as in the light densenet121 and inception_v2) carry two elementwise layers per
normalization. As a BatchNormalization with mean 0, variance 1 and epsilon 0 they are one
layer — ``(x - 0) / sqrt(1 + 0) * scale + shift`` is ``x * scale + shift`` exactly — which
``fold_batch_norm`` then folds into a Conv before it, and which a backend can fuse an
activation into.
"""

from __future__ import annotations

import numpy as np

from flowrt.engine.graph.graph import Graph, Layer, OutputSlot, constant_value
from flowrt.engine.graph.layers.normalization import BatchNormalizationDescriptor
from flowrt.engine.graph.passes.fold_batch_norm import constant_slot
from flowrt.types import DataType


def _per_channel(layer: Layer) -> tuple[OutputSlot, np.ndarray] | None:
    """``(data input, per-channel vector)`` when ``layer`` multiplies or adds a float32 NCHW
    tensor by a constant of shape (C, 1, ...) or (1, C, 1, ...) — the same shape out as in."""
    if layer.kind not in ("Mul", "Add") or len(layer.inputs) != 2:
        return None
    for data, other in ((0, 1), (1, 0)):
        source, value = layer.inputs[data].source, constant_value(layer.inputs[other].source)
        if source is None:
            continue
        info, out = source.info, layer.outputs[0].info
        if value is None or info is None or out is None or info.dtype is not DataType.FLOAT32:
            continue
        shape = info.shape
        if shape is None or out.shape is None or len(shape) < 3 or not isinstance(shape[1], int):
            continue  # unknown rank: no channel axis to fold along
        if tuple(out.shape) != tuple(shape):
            continue
        channels = shape[1]
        trailing = len(shape) - 2
        if value.dtype != np.float32 or value.shape not in (
            (channels,) + (1,) * trailing,
            (1, channels) + (1,) * trailing,
        ):
            continue
        return source, value.reshape(channels)
    return None


def _only_reader(slot: OutputSlot) -> Layer | None:
    return slot.connections[0].layer if len(slot.connections) == 1 else None


def fold_scale_shift(graph: Graph) -> list[str]:
    """Replace each per-channel ``Mul`` (optionally followed by a per-channel ``Add``), and each
    lone per-channel ``Add``, by an equivalent BatchNormalization; return the changes."""
    changes = []
    for layer in graph.topological_order():
        if layer.name not in graph.layers:
            continue  # already folded as the Add of a Mul
        match = _per_channel(layer)
        if match is None:
            continue
        source, vector = match
        channels = vector.shape[0]
        scale, shift, folded = np.ones(channels, np.float32), np.zeros(channels, np.float32), [layer]
        if layer.kind == "Mul":
            scale = vector
            after = _only_reader(layer.outputs[0])
            add = _per_channel(after) if after is not None else None
            if after is not None and add is not None and add[0] is layer.outputs[0]:
                shift = add[1]
                folded.append(after)
        else:
            shift = vector
        bn = graph.add_layer(
            "BatchNormalization", BatchNormalizationDescriptor(epsilon=0.0), name=f"{layer.name}/scale_shift"
        )
        source.connect(bn.inputs[0])
        for slot, (suffix, value) in zip(
            bn.inputs[1:],
            [
                ("scale", scale),
                ("shift", shift),
                ("mean", np.zeros(channels, np.float32)),
                ("var", np.ones(channels, np.float32)),
            ],
        ):
            constant_slot(graph, f"{bn.name}/{suffix}", value).connect(slot)
        bn.outputs[0].info = folded[-1].outputs[0].info
        graph.reroute(folded[-1].outputs[0], bn.outputs[0])
        for old in folded:
            graph.remove_layer(old)
        changes.append(f"folded {' + '.join(f'{o.kind} {o.name!r}' for o in folded)} into BatchNormalization")
    graph.remove_unread_constants()
    return changes
