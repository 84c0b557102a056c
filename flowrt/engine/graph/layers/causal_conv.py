"""CausalConvWithState (opset 27): a causal depthwise 1-D convolution that carries its left
context from one call to the next, as Mamba's and Gated DeltaNet's decoders use it."""

from __future__ import annotations

import attrs

from flowrt.engine.graph.layer_kind import layer_kind
from flowrt.engine.graph.layers.detection import expect_dims
from flowrt.engine.graph.layers.elementwise import expect_dtype
from flowrt.errors import DataTypeError, ShapeError
from flowrt.types import DataType, Dim, TensorInfo

_TYPES = frozenset({DataType.FLOAT32, DataType.FLOAT16, DataType.BFLOAT16})
ACTIVATIONS = ("none", "silu", "swish")


@attrs.frozen
class CausalConvWithStateDescriptor:
    """CausalConvWithState: each channel of a [batch, channels, length] input convolved with its
    own ``k`` taps (weight [channels, 1, k]) over the ``k - 1`` positions before it, which come
    from ``past_state`` [batch, channels, k - 1] (absent: zeros); then ``activation`` ("silu"
    and "swish" are the same: x * sigmoid(x)). The second output is the last ``k - 1``
    positions of past state and input together: the next call's ``past_state``."""

    activation: str = attrs.field(default="none", validator=attrs.validators.in_(ACTIVATIONS))


def _taps(weight: TensorInfo, channels: Dim, where: str) -> Dim:
    """The kernel size ``k`` of a [channels, 1, k] weight; ShapeError when it is not that."""
    expect_dims(weight, (channels, 1, None), "weight [channels, 1, k]", where)
    if weight.shape is None:
        return None
    k = weight.shape[2]
    if isinstance(k, int) and k < 1:
        raise ShapeError(f"{where}: a kernel of at least 1 tap expected, got weight {weight.format_shape()}")
    return k


@layer_kind("CausalConvWithState", CausalConvWithStateDescriptor, min_inputs=2, max_inputs=4, num_outputs=2)
def infer_causal_conv_with_state(desc: CausalConvWithStateDescriptor, inputs, consts):
    where = "CausalConvWithState"
    x, weight = inputs[0], inputs[1]
    bias = inputs[2] if len(inputs) > 2 else None
    past_state = inputs[3] if len(inputs) > 3 else None
    expect_dtype(x, _TYPES, f"{where} input")
    for info, name in ((weight, "weight"), (bias, "bias"), (past_state, "past_state")):
        if info is not None and info.dtype != x.dtype:
            raise DataTypeError(
                f"{where}: {name} of the input's type {x.dtype.name.lower()} expected, got {info.dtype.name.lower()}"
            )
    batch: Dim = None
    channels: Dim = None
    if x.shape is not None:
        if len(x.shape) != 3:
            raise ShapeError(f"{where}: input [batch, channels, length] expected, got {x.format_shape()}")
        batch, channels = x.shape[0], x.shape[1]
    k = _taps(weight, channels, where)
    if channels is None and weight.shape is not None:
        channels = weight.shape[0]
    state = k - 1 if isinstance(k, int) else None
    if bias is not None:
        expect_dims(bias, (channels,), "bias [channels]", where)
    if past_state is not None:
        expect_dims(past_state, (batch, channels, state), "past_state [batch, channels, k - 1]", where)
    present = TensorInfo((batch, channels, state), x.dtype)
    return [x, present]
