"""CumSum and CumProd: running sums and products along an axis given as an input."""

from __future__ import annotations

import attrs
import numpy as np

from flowrt.engine.graph.layer_kind import layer_kind
from flowrt.engine.graph.layers.elementwise import NUMERIC_TYPES, expect_dtype
from flowrt.engine.graph.layers.reshape import const_ints
from flowrt.engine.graph.shapes import normalize_axis
from flowrt.errors import ShapeError
from flowrt.types import DataType

# ONNX leaves out the 8- and 16-bit integers.
_CUMULATIVE_TYPES = NUMERIC_TYPES - {DataType.INT8, DataType.INT16, DataType.UINT8, DataType.UINT16}
_AXIS_TYPES = frozenset({DataType.INT32, DataType.INT64})


@attrs.frozen
class CumulativeDescriptor:
    """CumSum / CumProd: ``exclusive`` 1 leaves each element out of its own result (the first
    becomes the identity, 0 or 1); ``reverse`` 1 runs from the end of the axis."""

    exclusive: int = attrs.field(default=0, validator=attrs.validators.in_((0, 1)))
    reverse: int = attrs.field(default=0, validator=attrs.validators.in_((0, 1)))


def cumulative_axis(axis_value: np.ndarray, rank: int, op: str) -> int:
    """The non-negative axis from the value of the axis input (a scalar or one element)."""
    values = const_ints(axis_value)
    assert values is not None  # the values of an array
    if len(values) != 1:
        raise ShapeError(f"{op}: axis must hold one value, got {values}")
    return normalize_axis(values[0], rank, op)


@layer_kind(["CumSum", "CumProd"], CumulativeDescriptor, min_inputs=2, max_inputs=2)
def infer_cumulative(desc: CumulativeDescriptor, inputs, consts):
    x, axis = inputs
    expect_dtype(x, _CUMULATIVE_TYPES, "input x")
    expect_dtype(axis, _AXIS_TYPES, "axis")
    if axis.shape is not None and len(axis.shape) > 1:
        raise ShapeError(f"axis must be a scalar or a 1-D tensor of one element, got {axis.format_shape()}")
    if consts[1] is not None and x.shape is not None:
        cumulative_axis(consts[1], len(x.shape), "axis input")
    return [x]
