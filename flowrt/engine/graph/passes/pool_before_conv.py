"""Average before a 1x1 conv instead of after it: the two commute, and pooling first leaves
the conv fewer pixels to multiply.

A 1x1 stride-1 Conv without padding is per pixel the affine map ``y = W x + b``, and an
AveragePool without padding takes each window's mean, so

    avg(W x + b) = W avg(x) + b

(a mean of affine maps is the affine map of the mean). DenseNet's transitions (BN, ReLU, a 1x1
conv halving the channels, a 2x2 stride-2 AveragePool) then run the conv on a quarter of the
pixels: on densenet121 a third of a 1x1 conv's work at each of its three transitions. The pool
reads the conv's input channels instead of its outputs, which costs far less than the conv
saves; the pass swaps only where it does. Results differ from the original order by rounding
only (the sums are taken in another order).
"""

from __future__ import annotations

import math

import attrs

from flowrt.engine.graph.graph import Graph, Layer
from flowrt.types import TensorInfo, static_dims


def _pointwise(conv: Layer) -> bool:
    """Whether ``conv`` is a 1x1 stride-1 Conv with no padding and no fused activation."""
    desc = conv.descriptor
    weights = conv.input_infos[1] if len(conv.inputs) > 1 else None
    if conv.activation is not None or weights is None or weights.shape is None:
        return False
    spatial = weights.shape[2:]
    return (
        all(k == 1 for k in (desc.kernel_shape or spatial))
        and all(s == 1 for s in desc.strides or ())
        and not any(desc.pads or ())
    )


def _plain_average(pool: Layer) -> bool:
    """Whether ``pool`` averages whole windows: no padding, no ceil mode, no fused activation."""
    desc = pool.descriptor
    return (
        pool.activation is None
        and desc.auto_pad in ("NOTSET", "VALID")
        and not any(desc.pads or ())
        and not desc.ceil_mode
    )


def _static_shape(info: TensorInfo | None) -> tuple[int, ...] | None:
    """``info``'s shape where every dim is known and there are spatial dims (N, C, ...)."""
    if info is None or not info.is_static or (info.rank or 0) < 3:
        return None
    return static_dims(info.shape)


def _saves(conv: Layer, pool: Layer) -> bool:
    """Whether the conv's multiplies saved outweigh the pool's added reads (known shapes only)."""
    x, y, pooled = map(_static_shape, (conv.input_infos[0], conv.output_infos[0], pool.output_infos[0]))
    if x is None or y is None or pooled is None:
        return False
    channels_in, channels_out = x[1], y[1]
    pixels_in, pixels_out = math.prod(y[2:]), math.prod(pooled[2:])
    window = math.prod(pool.descriptor.kernel_shape)
    saved = channels_in * channels_out // conv.descriptor.group * (pixels_in - pixels_out)
    added = (channels_in - channels_out) * pixels_out * window
    return saved > added


def pool_before_conv(graph: Graph) -> list[str]:
    """Move each AveragePool that is the only reader of a 1x1 conv before that conv, where that
    saves work; return the changes."""
    changes = []
    for pool in graph.of_kind("AveragePool"):
        source = pool.inputs[0].source
        if source is None or source.layer.kind != "Conv" or len(source.connections) != 1:
            continue
        conv = source.layer
        x = conv.inputs[0].source
        if x is None or not _pointwise(conv) or not _plain_average(pool) or not _saves(conv, pool):
            continue
        x_info, pooled = conv.input_infos[0], pool.output_infos[0]
        assert x_info is not None and pooled is not None  # _saves found both shapes static
        # x -> pool -> conv -> the pool's readers
        x.disconnect(conv.inputs[0])
        conv.outputs[0].disconnect(pool.inputs[0])
        graph.reroute(pool.outputs[0], conv.outputs[0])
        x.connect(pool.inputs[0])
        pool.outputs[0].connect(conv.inputs[0])
        channels, pooled_shape = static_dims(x_info.shape)[1], static_dims(pooled.shape)
        pool.outputs[0].info = attrs.evolve(pooled, shape=(pooled_shape[0], channels, *pooled_shape[2:]))
        conv.outputs[0].info = pooled  # what the pool gave before, the conv gives now
        changes.append(
            f"moved AveragePool {pool.name!r} before Conv {conv.name!r}: a 1x1 conv commutes with an "
            "average, and pooled first it multiplies fewer pixels"
        )
    return changes
