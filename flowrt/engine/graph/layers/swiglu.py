"""SwiGLU (opset 28): a gate's Swish times a value, the feed-forward gate of Llama-style models."""

from __future__ import annotations

import attrs

from flowrt.engine.graph.layer_kind import layer_kind
from flowrt.engine.graph.layers.elementwise import FLOAT_TYPES, expect_dtype, expect_same_dtype
from flowrt.errors import ShapeError
from flowrt.types import Dim, TensorInfo


@attrs.frozen
class SwiGLUDescriptor:
    """SwiGLU: ``A * sigmoid(alpha * A) * B`` (Swish of the gate ``A`` with the same ``alpha``,
    times the value ``B``). ``A`` and ``B`` have one shape: nothing is broadcast."""

    alpha: float = 1.0


def _same_dim(a: Dim, b: Dim) -> Dim:
    """The dim two equal-shaped tensors share: the known one where only one is known."""
    return a if isinstance(a, int) or b is None else b


@layer_kind("SwiGLU", SwiGLUDescriptor, min_inputs=2, max_inputs=2)
def infer_swiglu(desc: SwiGLUDescriptor, inputs, consts):
    gate, value = inputs
    expect_dtype(gate, FLOAT_TYPES, "SwiGLU input A")
    expect_same_dtype([gate, value], "SwiGLU A and B")
    if gate.shape is None or value.shape is None:
        return [gate if gate.shape is not None else value]
    conflict = len(gate.shape) != len(value.shape) or any(
        isinstance(a, int) and isinstance(b, int) and a != b for a, b in zip(gate.shape, value.shape)
    )
    if conflict:
        raise ShapeError(
            f"SwiGLU: A and B of one shape expected (nothing is broadcast), "
            f"got {gate.format_shape()} and {value.format_shape()}"
        )
    return [TensorInfo(tuple(map(_same_dim, gate.shape, value.shape)), gate.dtype)]
