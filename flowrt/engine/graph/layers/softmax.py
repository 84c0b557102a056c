"""Softmax, LogSoftmax and Hardmax: normalizing a tensor along one axis.

From opset 13 the op works along ``axis`` (default -1). Before, the input is first coerced to
2-D, [prod(dims[:axis]), prod(dims[axis:])] with ``axis`` defaulting to 1, and the op works
along the second dim: one distribution over all the trailing dims together.
"""

from __future__ import annotations

import attrs

from flowrt.engine.graph.layer_kind import layer_kind
from flowrt.engine.graph.layers.elementwise import FLOAT_TYPES, expect_dtype
from flowrt.engine.graph.shapes import broadcasts_to, normalize_axis
from flowrt.errors import ShapeError
from flowrt.types import TensorInfo

LATEST_OPSET = 21


@attrs.frozen
class SoftmaxDescriptor:
    """Softmax / LogSoftmax / Hardmax: ``axis`` (unset: -1 from opset 13, 1 before)."""

    axis: int | None = None
    opset: int = LATEST_OPSET

    @property
    def coerces_to_2d(self) -> bool:
        """Whether the op sees its input as 2-D (opset < 13)."""
        return self.opset < 13

    def resolved_axis(self, rank: int, where: str) -> int:
        """The non-negative axis for an input of ``rank``; ShapeError when out of range."""
        axis = self.axis if self.axis is not None else (1 if self.coerces_to_2d else -1)
        if self.coerces_to_2d:
            # The 2-D coercion is defined for axis == rank too (every dim in the rows).
            if not -rank <= axis <= rank:
                raise ShapeError(f"{where}: axis {axis} is out of range [{-rank}, {rank}] for rank {rank}")
            return axis + rank if axis < 0 else axis
        return normalize_axis(axis, rank, where)


def _softmax_infer(name: str):
    def infer(desc: SoftmaxDescriptor, inputs, consts):
        x = inputs[0]
        expect_dtype(x, FLOAT_TYPES, name)
        if x.shape is not None:
            desc.resolved_axis(len(x.shape), name)
        return [TensorInfo(x.shape, x.dtype)]

    return infer


for _name in ("Softmax", "LogSoftmax", "Hardmax"):
    layer_kind(_name, SoftmaxDescriptor)(_softmax_infer(_name))


@attrs.frozen
class AttentionSoftmaxDescriptor:
    """AttentionSoftmax: ``softmax(scale * X + mask)`` along the last axis."""

    scale: float = 1.0


@layer_kind("AttentionSoftmax", AttentionSoftmaxDescriptor, min_inputs=1, max_inputs=2)
def infer_attention_softmax(desc, inputs, consts):
    """flowrt's own: attention's scores scaled, masked and normalized in one layer,
    ``softmax(scale * X + mask)`` along X's last axis, the mask (optional: None) added to X
    and broadcast to its shape, as numpy broadcasts (what the optimizer fuses a Mul by a
    scalar, an Add and a Softmax into, where a backend offers that fusion)."""
    x, mask = (list(inputs) + [None])[:2]
    expect_dtype(x, FLOAT_TYPES, "AttentionSoftmax")
    if x.shape is not None and len(x.shape) == 0:
        raise ShapeError("AttentionSoftmax expects X of rank 1 or more, got a scalar")
    if mask is not None:
        if mask.dtype != x.dtype:
            raise ShapeError(
                f"AttentionSoftmax expects a mask of X's type {x.dtype.value}, got {mask.dtype.value}"
            )
        if x.shape is not None and mask.shape is not None and not broadcasts_to(mask.shape, x.shape):
            raise ShapeError(
                f"AttentionSoftmax expects a mask that broadcasts to X's shape {x.format_shape()}, "
                f"got {mask.format_shape()}"
            )
    return [TensorInfo(x.shape, x.dtype)]
