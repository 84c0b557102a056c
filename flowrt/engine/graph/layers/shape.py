"""Shape, Size, ConstantOfShape, Range and OneHot: layers that make tensors from shapes and counts."""

from __future__ import annotations

import math

import attrs
import numpy as np

from flowrt.engine.graph.layer_kind import NoDescriptor, layer_kind
from flowrt.engine.graph.layers.reshape import const_ints
from flowrt.engine.graph.shapes import normalize_axis
from flowrt.errors import DataTypeError, ShapeError
from flowrt.types import DataType, TensorInfo


@attrs.frozen
class ShapeDescriptor:
    """Shape: the dims ``start`` to ``end`` (exclusive, clamped, negative from the end; opset 15)."""

    start: int = 0
    end: int | None = None


@layer_kind("Shape", ShapeDescriptor)
def infer_shape(desc: ShapeDescriptor, inputs, consts):
    data = inputs[0]
    if data.shape is None:
        return [TensorInfo((None,), DataType.INT64)]
    # Python's slice clamping is the one ONNX specifies.
    dims = data.shape[desc.start : desc.end]
    return [TensorInfo((len(dims),), DataType.INT64)]


@layer_kind("Size", NoDescriptor)
def infer_size(desc, inputs, consts):
    return [TensorInfo((), DataType.INT64)]


def _single_value(value: np.ndarray | None) -> np.ndarray | None:
    if value is None:
        return None
    value = np.asarray(value)
    if value.size != 1:
        raise ValueError(f"ConstantOfShape's value must hold one element, got shape {value.shape}")
    return value.reshape(())


@attrs.frozen(eq=False)
class ConstantOfShapeDescriptor:
    """ConstantOfShape: a tensor of the input's shape filled with ``value`` (default float32 0)."""

    value: np.ndarray | None = attrs.field(default=None, converter=_single_value)

    @property
    def fill(self) -> np.ndarray:
        return np.zeros((), np.float32) if self.value is None else self.value


@layer_kind("ConstantOfShape", ConstantOfShapeDescriptor)
def infer_constant_of_shape(desc: ConstantOfShapeDescriptor, inputs, consts):
    dtype = DataType.from_numpy(desc.fill.dtype)
    target = const_ints(consts[0])
    if target is not None:
        if any(d < 0 for d in target):
            raise ShapeError(f"ConstantOfShape: dims must be >= 0, got {target}")
        return [TensorInfo(tuple(target), dtype)]
    shape = inputs[0].shape
    length = shape[0] if shape is not None and len(shape) == 1 else None
    return [TensorInfo(None if not isinstance(length, int) else (None,) * length, dtype)]


@attrs.frozen
class RangeDescriptor:
    """Range: start, start + delta, ... up to (excluding) limit; from opset 27 ``stash_type``
    is the type low-precision floats are computed in (1: float32, 11: float64)."""

    stash_type: int = attrs.field(default=1, validator=attrs.validators.in_((1, 11)))
    opset: int = 22


def range_length(start: float | int, limit: float | int, delta: float | int) -> int:
    """Number of Range elements: max(ceil((limit - start) / delta), 0)."""
    if delta == 0:
        raise ShapeError("Range: delta may not be 0")
    if isinstance(start, int) and isinstance(limit, int) and isinstance(delta, int):
        return max(-((start - limit) // delta), 0)  # exact for large ints
    return max(math.ceil((limit - start) / delta), 0)


@layer_kind("Range", RangeDescriptor, min_inputs=3, max_inputs=3)
def infer_range(desc: RangeDescriptor, inputs, consts):
    dtype = inputs[0].dtype
    if any(i.dtype != dtype for i in inputs):
        found = ", ".join(str(i.dtype.name.lower()) for i in inputs)
        raise DataTypeError(f"Range: start, limit and delta of one type expected, got {found}")
    if any(c is None for c in consts):
        return [TensorInfo((None,), dtype)]
    return [TensorInfo((range_length(*(np.asarray(c).item() for c in consts)),), dtype)]


@attrs.frozen
class OneHotDescriptor:
    """OneHot: a new ``depth``-long axis at ``axis`` holding values[1] where it equals the index
    (negative indices count from depth) and values[0] elsewhere."""

    axis: int = -1


@layer_kind("OneHot", OneHotDescriptor, min_inputs=3, max_inputs=3)
def infer_one_hot(desc: OneHotDescriptor, inputs, consts):
    indices, _, values = inputs
    depth = None if consts[1] is None else int(np.asarray(consts[1]).reshape(-1)[0])
    if depth is not None and depth < 1:
        raise ShapeError(f"OneHot: depth must be at least 1, got {depth}")
    if indices.shape is None:
        return [TensorInfo(None, values.dtype)]
    axis = normalize_axis(desc.axis, len(indices.shape) + 1, "OneHot")
    shape = indices.shape[:axis] + (depth,) + indices.shape[axis:]
    return [TensorInfo(shape, values.dtype)]
