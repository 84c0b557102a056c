"""Basic value types shared by every layer of flowrt: data types, tensor infos, priorities."""

from __future__ import annotations

import enum
import functools
from collections.abc import Iterable, Sequence
from typing import Any

import attrs
import numpy as np

from flowrt.errors import DataTypeError, ShapeError


class DataType(enum.Enum):
    """Element type of a tensor; values are the numpy dtype names.

    The low-precision types ONNX defines beyond numpy's (bfloat16, the float8, float6 and float4
    kinds, and the 4- and 2-bit integers) are ``ml_dtypes``' numpy dtypes. Each element takes a
    whole byte in memory (two for bfloat16): ONNX packs the 6-, 4- and 2-bit types only in files.
    """

    FLOAT32 = "float32"
    FLOAT16 = "float16"
    FLOAT64 = "float64"
    BFLOAT16 = "bfloat16"
    FLOAT8E4M3FN = "float8_e4m3fn"
    FLOAT8E4M3FNUZ = "float8_e4m3fnuz"
    FLOAT8E5M2 = "float8_e5m2"
    FLOAT8E5M2FNUZ = "float8_e5m2fnuz"
    FLOAT8E8M0 = "float8_e8m0fnu"
    FLOAT6E2M3 = "float6_e2m3fn"
    FLOAT6E3M2 = "float6_e3m2fn"
    FLOAT4E2M1 = "float4_e2m1fn"
    INT4 = "int4"
    UINT4 = "uint4"
    INT2 = "int2"
    UINT2 = "uint2"
    INT8 = "int8"
    UINT8 = "uint8"
    INT16 = "int16"
    UINT16 = "uint16"
    INT32 = "int32"
    UINT32 = "uint32"
    INT64 = "int64"
    UINT64 = "uint64"
    BOOL = "bool"
    STRING = "object"

    @property
    def numpy(self) -> np.dtype:
        """The numpy dtype of this data type (an ``ml_dtypes`` one for the low-precision types)."""
        return _ml_dtype(self) if self in _LOW_PRECISION else np.dtype(self.value)

    @property
    def itemsize(self) -> int:
        """Bytes per element in memory."""
        return self.numpy.itemsize

    @property
    def bits(self) -> int:
        """Bits per element as ONNX counts them: 4 for int4 and float4e2m1, 6 for the float6
        types, 2 for int2 (each still takes a byte in memory)."""
        return _SUB_BYTE_BITS.get(self, 8 * self.itemsize)

    @property
    def is_float(self) -> bool:
        """True for every floating-point type, the 8-, 6- and 4-bit ones included."""
        return self in _FLOAT_TYPES

    @property
    def is_low_precision(self) -> bool:
        """True for the types numpy has only through ``ml_dtypes``."""
        return self in _LOW_PRECISION

    @classmethod
    def from_numpy(cls, dtype: np.dtype | type) -> DataType:
        """The data type of a numpy dtype; raises DataTypeError for one flowrt lacks."""
        found = _BY_DTYPE.get(dtype) if isinstance(dtype, np.dtype) else None
        if found is not None:  # every run checks its feeds' dtypes: dt.name takes 2 us
            return found
        if isinstance(dtype, str) and dtype in _BY_VALUE:  # "bfloat16" before ml_dtypes is imported
            return _BY_VALUE[dtype]
        dt = np.dtype(dtype)
        if dt.kind in "OUS":
            return cls.STRING
        try:
            found = cls(dt.name)
        except ValueError:
            raise DataTypeError(f"numpy dtype {dt} has no flowrt DataType") from None
        _BY_DTYPE[dt] = found
        return found

    def __repr__(self) -> str:
        return f"DataType.{self.name}"


_D = DataType
_BY_VALUE = {d.value: d for d in DataType}
_BY_DTYPE: dict[np.dtype, DataType] = {}  # numpy dtypes met so far, strings aside
_LOW_PRECISION = frozenset({
    _D.BFLOAT16, _D.FLOAT8E4M3FN, _D.FLOAT8E4M3FNUZ, _D.FLOAT8E5M2, _D.FLOAT8E5M2FNUZ,
    _D.FLOAT8E8M0, _D.FLOAT6E2M3, _D.FLOAT6E3M2, _D.FLOAT4E2M1, _D.INT4, _D.UINT4, _D.INT2, _D.UINT2,
})  # fmt: skip


@functools.cache
def _ml_dtype(data_type: DataType) -> np.dtype:
    """``ml_dtypes``' numpy dtype for a low-precision type, by attribute (numpy knows
    ml_dtypes' names only once it is imported; imported here, on first use: 5 ms)."""
    import ml_dtypes

    return np.dtype(getattr(ml_dtypes, data_type.value))


_SUB_BYTE_BITS = {
    _D.FLOAT6E2M3: 6, _D.FLOAT6E3M2: 6, _D.FLOAT4E2M1: 4, _D.INT4: 4, _D.UINT4: 4, _D.INT2: 2, _D.UINT2: 2,
}  # fmt: skip
_FLOAT_TYPES = frozenset({_D.FLOAT16, _D.FLOAT32, _D.FLOAT64}) | (
    _LOW_PRECISION - {_D.INT4, _D.UINT4, _D.INT2, _D.UINT2}
)


# A dimension is an int when known, a str when the model names it symbolically, None when unknown.
Dim = int | str | None


def static_dims(dims: Sequence[Dim] | None) -> tuple[int, ...]:
    """``dims`` as a static shape: ShapeError unless the rank and every dim are known ints."""
    known = tuple(d for d in dims or () if isinstance(d, int))
    if dims is None or len(known) != len(dims):
        raise ShapeError(f"expected a static shape, got {None if dims is None else tuple(dims)}")
    return known


def _to_shape(value: Iterable[Any] | None) -> tuple[Dim, ...] | None:
    if value is None:
        return None
    return tuple(d if d is None or isinstance(d, str) else int(d) for d in value)


@attrs.frozen
class Quantization:
    """Affine quantization parameters: real = scale * (q - zero_point)."""

    scale: float
    zero_point: int = 0


@attrs.frozen
class TensorInfo:
    """Shape and data type of a tensor.

    ``shape`` is a tuple of dims (int, symbolic name, or None for unknown), or None when
    even the rank is unknown.
    """

    shape: tuple[Dim, ...] | None = attrs.field(converter=_to_shape)
    dtype: DataType = attrs.field(
        default=DataType.FLOAT32,
        converter=lambda d: d if isinstance(d, DataType) else DataType.from_numpy(d),
    )
    quantization: Quantization | None = None

    @property
    def rank(self) -> int | None:
        return None if self.shape is None else len(self.shape)

    @property
    def is_static(self) -> bool:
        """True when every dimension is a known int."""
        return self.shape is not None and all(isinstance(d, int) for d in self.shape)

    @property
    def num_elements(self) -> int | None:
        if self.shape is None:
            return None
        count = 1  # a Python int: never overflows
        for d in self.shape:
            if not isinstance(d, int):
                return None
            count *= d
        return count

    @property
    def num_bytes(self) -> int | None:
        n = self.num_elements
        return None if n is None else n * self.dtype.itemsize

    def with_shape(self, shape: Iterable[Any] | None) -> TensorInfo:
        return attrs.evolve(self, shape=shape)

    def with_dtype(self, dtype: DataType | np.dtype | type) -> TensorInfo:
        return attrs.evolve(self, dtype=dtype)

    @classmethod
    def of(cls, array: np.ndarray) -> TensorInfo:
        """The info of a concrete array."""
        array = np.asarray(array)
        return cls(array.shape, DataType.from_numpy(array.dtype))

    def format_shape(self) -> str:
        if self.shape is None:
            return "(?)"
        dims = ["?" if d is None else str(d) for d in self.shape]
        return "(" + ", ".join(dims) + ("," if len(dims) == 1 else "") + ")"

    def __str__(self) -> str:
        return f"{self.dtype.name.lower()}{self.format_shape()}"


class Priority(enum.IntEnum):
    """Scheduling priority of a run; a lower value is served first."""

    HIGH = 0
    MEDIUM = 1
    NORMAL = 1  # alias of MEDIUM
    LOW = 2


__all__ = ["DataType", "Dim", "Priority", "Quantization", "TensorInfo"]
