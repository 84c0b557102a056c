"""Element types as ONNX Runtime names them: ``tensor(float)`` for float32, ``tensor(double)``
for float64, and ONNX's ``TensorProto`` numbers (``OrtValue.element_type()``)."""

from __future__ import annotations

from typing import Any

import numpy as np

from flowrt.types import DataType
from flowrt.validate import argument_error

# numpy dtype name -> (ONNX Runtime's type name, onnx.TensorProto element type).
_TYPES: dict[str, tuple[str, int]] = {
    "float32": ("float", 1),
    "uint8": ("uint8", 2),
    "int8": ("int8", 3),
    "uint16": ("uint16", 4),
    "int16": ("int16", 5),
    "int32": ("int32", 6),
    "int64": ("int64", 7),
    "object": ("string", 8),
    "bool": ("bool", 9),
    "float16": ("float16", 10),
    "float64": ("double", 11),
    "uint32": ("uint32", 12),
    "uint64": ("uint64", 13),
    "bfloat16": ("bfloat16", 16),
}
_BY_ELEMENT_TYPE = {number: name for name, (_, number) in _TYPES.items()}


def _key(dtype: DataType | np.dtype | type) -> str:
    if isinstance(dtype, DataType):
        return dtype.value
    dt = np.dtype(dtype)
    return "object" if dt.kind in "OUS" else dt.name


def type_name(dtype: DataType | np.dtype | type) -> str:
    """``tensor(<name>)`` as ONNX Runtime writes it: ``tensor(float)``, ``tensor(int64)``."""
    key = _key(dtype)
    return f"tensor({_TYPES[key][0] if key in _TYPES else key})"


def element_type(dtype: DataType | np.dtype | type) -> int:
    """The ``onnx.TensorProto`` number of a data type (1 for float32); 0 (UNDEFINED) for none."""
    return _TYPES.get(_key(dtype), ("", 0))[1]


def numpy_dtype(value: Any, *, name: str = "element_type", where: str | None = None) -> np.dtype:
    """A numpy dtype from what ONNX Runtime takes as an element type: a numpy type (np.float32)
    or an ONNX ``TensorProto`` number (1). ArgumentError for anything else."""
    if isinstance(value, int) and not isinstance(value, bool):
        if value in _BY_ELEMENT_TYPE and _BY_ELEMENT_TYPE[value] != "bfloat16":
            return np.dtype(_BY_ELEMENT_TYPE[value])
        raise argument_error(name, "an ONNX element type numpy can hold (1 for float, ...)", value, where)
    try:
        return np.dtype(value)
    except TypeError:
        raise argument_error(
            name, "a numpy dtype (np.float32) or an ONNX element type number", value, where
        ) from None
