"""Det: the determinant of each square matrix of a batch."""

from __future__ import annotations

from flowrt.engine.graph.layer_kind import layer_kind
from flowrt.engine.graph.layers.elementwise import expect_dtype
from flowrt.engine.graph.layers.grid import GRID_FLOATS
from flowrt.errors import ShapeError
from flowrt.types import TensorInfo


@layer_kind("Det")
def infer_det(desc, inputs, consts):
    (x,) = inputs
    expect_dtype(x, GRID_FLOATS, "Det input")
    if x.shape is None:
        return [TensorInfo(None, x.dtype)]
    rows, cols = (x.shape[-2], x.shape[-1]) if len(x.shape) >= 2 else (None, None)
    if len(x.shape) < 2 or (isinstance(rows, int) and isinstance(cols, int) and rows != cols):
        raise ShapeError(f"Det: square matrices [*, M, M] expected, got {x.format_shape()}")
    return [TensorInfo(x.shape[:-2], x.dtype)]
