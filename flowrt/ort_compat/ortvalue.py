"""ONNX Runtime's ``OrtValue``: a tensor in host memory, wrapping a numpy array without a copy."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from flowrt.ort_compat.types import element_type, numpy_dtype, type_name
from flowrt.validate import argument_error

_WHERE = "OrtValue"


def check_cpu(device_type: Any, device_id: Any, where: str) -> None:
    """ArgumentError unless the device is ONNX Runtime's "cpu" (device 0): flowrt's values
    live in host memory; GpuAcc copies them to its device itself."""
    if not isinstance(device_type, str) or device_type.lower() != "cpu":
        raise argument_error("device_type", '"cpu" (flowrt binds host memory only)', device_type, where)
    if device_id != 0:
        raise argument_error("device_id", "0 for the cpu", device_id, where)


class OrtValue:
    """A tensor for ``run_with_ort_values`` and ``io_binding``: a view of a numpy array, never
    a copy. The array must outlive its uses; ``numpy()`` returns the array itself."""

    __slots__ = ("_array",)

    def __init__(self, array: np.ndarray) -> None:
        if not isinstance(array, np.ndarray):
            raise argument_error("array", "a numpy array", array, _WHERE)
        self._array = array

    @classmethod
    def ortvalue_from_numpy(
        cls, numpy_obj: np.ndarray, /, device_type: str = "cpu", device_id: int = 0, vendor_id: int = -1
    ) -> OrtValue:
        """Wrap ``numpy_obj`` without copying it (on "cpu", ONNX Runtime does the same)."""
        check_cpu(device_type, device_id, f"{_WHERE}.ortvalue_from_numpy")
        if not isinstance(numpy_obj, np.ndarray):
            raise argument_error("numpy_obj", "a numpy array", numpy_obj, f"{_WHERE}.ortvalue_from_numpy")
        return cls(numpy_obj)

    @classmethod
    def ortvalue_from_shape_and_type(
        cls,
        shape: Sequence[int],
        element_type: Any = np.float32,
        device_type: str = "cpu",
        device_id: int = 0,
        vendor_id: int = -1,
    ) -> OrtValue:
        """A new zero-filled tensor of ``shape`` and ``element_type`` (a numpy type or an ONNX number)."""
        where = f"{_WHERE}.ortvalue_from_shape_and_type"
        check_cpu(device_type, device_id, where)
        dtype = numpy_dtype(element_type, where=where)
        if not isinstance(shape, Sequence) or not all(isinstance(d, int) and d >= 0 for d in shape):
            raise argument_error("shape", "a sequence of ints >= 0", shape, where)
        return cls(np.zeros(tuple(shape), dtype))

    def numpy(self) -> np.ndarray:
        """The array itself (no copy): writes to it are writes to the value."""
        return self._array

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        if copy:
            return np.array(self._array, dtype=dtype, copy=True)
        return self._array if dtype is None else self._array.astype(dtype, copy=False)

    def update_inplace(self, np_arr: np.ndarray) -> None:
        """Copy ``np_arr`` into this value (same shape and dtype)."""
        np.copyto(self._array, np_arr, casting="no")

    def shape(self) -> list[int]:
        return list(self._array.shape)

    def data_type(self) -> str:
        """``tensor(float)`` for float32, as ONNX Runtime names types."""
        return type_name(self._array.dtype)

    def element_type(self) -> int:
        """The ONNX ``TensorProto`` number of the element type (1 for float32)."""
        return element_type(self._array.dtype)

    def device_name(self) -> str:
        return "cpu"

    def data_ptr(self) -> int:
        """The address of the first element."""
        return int(self._array.ctypes.data)

    def tensor_size_in_bytes(self) -> int:
        return int(self._array.nbytes)

    def has_value(self) -> bool:
        return True

    def is_tensor(self) -> bool:
        return True

    def is_sparse_tensor(self) -> bool:
        return False

    def is_tensor_sequence(self) -> bool:
        return False

    def __repr__(self) -> str:
        return f"OrtValue({self.data_type()}, shape={self.shape()})"


def array_at(buffer_ptr: int, element_type: Any, shape: Sequence[int], where: str) -> np.ndarray:
    """A numpy view of caller memory at ``buffer_ptr`` (ONNX Runtime's raw-pointer binding):
    the memory must hold ``shape`` elements of ``element_type`` and outlive the view."""
    import ctypes

    dtype = numpy_dtype(element_type, where=where)
    if not isinstance(buffer_ptr, int) or isinstance(buffer_ptr, bool) or buffer_ptr <= 0:
        raise argument_error("buffer_ptr", "a memory address (an int > 0)", buffer_ptr, where)
    if not isinstance(shape, Sequence) or not all(isinstance(d, int) and d >= 0 for d in shape):
        raise argument_error("shape", "a sequence of ints >= 0", shape, where)
    size = math.prod(shape) * dtype.itemsize
    raw = (ctypes.c_char * size).from_address(buffer_ptr)
    return np.frombuffer(memoryview(raw), dtype).reshape(tuple(shape))
