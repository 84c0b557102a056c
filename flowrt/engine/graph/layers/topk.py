"""TopK: the k largest (or smallest) elements along an axis, and their indices."""

from __future__ import annotations

import attrs

from flowrt.engine.graph.layer_kind import layer_kind
from flowrt.engine.graph.layers.elementwise import NUMERIC_TYPES, expect_dtype
from flowrt.engine.graph.layers.reshape import const_ints
from flowrt.engine.graph.shapes import normalize_axis
from flowrt.errors import ShapeError
from flowrt.types import DataType, Dim, TensorInfo


@attrs.frozen
class TopKDescriptor:
    """TopK along ``axis``: ``k`` is an attribute before opset 10 and an input from then on;
    ``largest`` 0 picks the smallest; ``sorted`` 0 allows any order (flowrt sorts anyway).
    Equal values come in the order of their indices, lowest first."""

    axis: int = -1
    k: int | None = attrs.field(default=None, validator=attrs.validators.optional(attrs.validators.ge(0)))
    largest: int = attrs.field(default=1, validator=attrs.validators.in_((0, 1)))
    sorted: int = attrs.field(default=1, validator=attrs.validators.in_((0, 1)))


def topk_count(desc: TopKDescriptor, k_value, dim: Dim) -> int | None:
    """k from the attribute or the K input's value (None when not known); ShapeError when it
    is negative or larger than the axis ``dim``."""
    if desc.k is not None:
        k = desc.k
    else:
        values = const_ints(k_value)
        if values is None:
            return None
        if len(values) != 1:
            raise ShapeError(f"TopK: K must hold one value, got {values}")
        k = values[0]
    if k < 0 or (isinstance(dim, int) and k > dim):
        raise ShapeError(f"TopK: k must be in [0, {dim}] (the axis length), got {k}")
    return k


@layer_kind("TopK", TopKDescriptor, min_inputs=1, max_inputs=2, num_outputs=2)
def infer_topk(desc: TopKDescriptor, inputs, consts):
    x = inputs[0]
    expect_dtype(x, NUMERIC_TYPES, "input X")
    has_k_input = len(inputs) > 1 and inputs[1] is not None
    if desc.k is None and not has_k_input:
        raise ShapeError("TopK: k expected (an attribute before opset 10, the K input after), found none")
    if has_k_input:
        expect_dtype(inputs[1], frozenset({DataType.INT64}), "input K")
    if x.shape is None:
        return [TensorInfo(None, x.dtype), TensorInfo(None, DataType.INT64)]
    axis = normalize_axis(desc.axis, len(x.shape), "TopK")
    k = topk_count(desc, consts[1] if has_k_input else None, x.shape[axis])
    shape = x.shape[:axis] + (k,) + x.shape[axis + 1 :]
    return [TensorInfo(shape, x.dtype), TensorInfo(shape, DataType.INT64)]
