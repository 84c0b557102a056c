"""ONNX Runtime's ``OrtValue``: a tensor in host memory, wrapping a numpy array without a copy,
or in the memory of GpuAcc's device (device type "opencl"), as a :class:`DeviceArray`."""

from __future__ import annotations

import math
import weakref
from collections.abc import Sequence
from typing import Any

import numpy as np

from flowrt.engine.scheduler.device_array import DeviceArray
from flowrt.ort_compat.types import element_type, numpy_dtype, type_name
from flowrt.validate import argument_error

_WHERE = "OrtValue"
# The device types that name GpuAcc's device (ONNX Runtime's "cuda" for its CUDA provider).
DEVICE_TYPES = ("opencl", "gpu")
# The device OrtValues made here, by data_ptr(): what IOBinding.bind_input's buffer_ptr names.
_BY_ADDRESS: weakref.WeakValueDictionary[int, DeviceArray] = weakref.WeakValueDictionary()


def on_device(device_type: Any, device_id: Any, where: str) -> bool:
    """Whether ``device_type`` names GpuAcc's device ("opencl" or "gpu") rather than host
    memory ("cpu"); ArgumentError for any other type, or a device id other than 0."""
    if not isinstance(device_type, str) or device_type.lower() not in ("cpu", *DEVICE_TYPES):
        raise argument_error(
            "device_type", '"cpu", or "opencl" for the device GpuAcc runs on', device_type, where
        )
    if device_id != 0:
        raise argument_error("device_id", "0", device_id, where)
    return device_type.lower() != "cpu"


def device_copy(array: np.ndarray) -> DeviceArray:
    """A copy of ``array`` on the device GpuAcc runs on by default (``FLOWRT_OPENCL_DEVICE``,
    else OpenCL's first GPU), known to ``IOBinding.bind_input`` by its address."""
    from flowrt.workers.gpu.context import device_context

    context = device_context()
    value = DeviceArray(context.upload(array), context, array.dtype)
    _BY_ADDRESS[address(value)] = value
    return value


def address(value: DeviceArray) -> int:
    """A device value's ``data_ptr``: its buffer's handle plus its offset."""
    return int(value.tensor.buffer.int_ptr) + int(value.tensor.offset)


def at_address(buffer_ptr: Any, element_type: Any, shape: Any, where: str) -> DeviceArray:
    """The device OrtValue's DeviceArray whose ``data_ptr()`` is ``buffer_ptr``, checked against
    ``element_type`` and ``shape``; ArgumentError for another address."""
    value = _BY_ADDRESS.get(buffer_ptr) if isinstance(buffer_ptr, int) else None
    if value is None:
        raise argument_error(
            "buffer_ptr", 'the data_ptr() of a live OrtValue made on the "opencl" device', buffer_ptr, where
        )
    dtype = numpy_dtype(element_type, where=where)
    if value.dtype != dtype or list(value.shape) != list(shape):
        raise argument_error(
            "element_type and shape",
            f"those of the value at buffer_ptr ({value.dtype}, {list(value.shape)})",
            (dtype, list(shape)),
            where,
        )
    return value


class OrtValue:
    """A tensor for ``run_with_ort_values`` and ``io_binding``: a view of a numpy array, never
    a copy (the array must outlive its uses; ``numpy()`` returns the array itself); or a
    DeviceArray on GpuAcc's device ("opencl"), which runs read where it is (``numpy()`` is a
    copy then, as ONNX Runtime's of a CUDA value)."""

    __slots__ = ("_array",)

    def __init__(self, array: np.ndarray | DeviceArray) -> None:
        if not isinstance(array, np.ndarray | DeviceArray):
            raise argument_error("array", "a numpy array", array, _WHERE)
        self._array = array

    def data(self) -> np.ndarray | DeviceArray:
        """What a run reads: the numpy array, or the DeviceArray."""
        return self._array

    @classmethod
    def ortvalue_from_numpy(
        cls, numpy_obj: np.ndarray, /, device_type: str = "cpu", device_id: int = 0, vendor_id: int = -1
    ) -> OrtValue:
        """Wrap ``numpy_obj`` without copying it (on "cpu", ONNX Runtime does the same), or copy
        it to GpuAcc's device ("opencl")."""
        device = on_device(device_type, device_id, f"{_WHERE}.ortvalue_from_numpy")
        if not isinstance(numpy_obj, np.ndarray):
            raise argument_error("numpy_obj", "a numpy array", numpy_obj, f"{_WHERE}.ortvalue_from_numpy")
        return cls(device_copy(numpy_obj) if device else numpy_obj)

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
        device = on_device(device_type, device_id, where)
        dtype = numpy_dtype(element_type, where=where)
        if not isinstance(shape, Sequence) or not all(isinstance(d, int) and d >= 0 for d in shape):
            raise argument_error("shape", "a sequence of ints >= 0", shape, where)
        zeros = np.zeros(tuple(shape), dtype)
        return cls(device_copy(zeros) if device else zeros)

    def numpy(self) -> np.ndarray:
        """The array itself (no copy): writes to it are writes to the value; a device value's
        host copy."""
        return self._array.numpy() if isinstance(self._array, DeviceArray) else self._array

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        array = self.numpy()
        if copy and not isinstance(self._array, DeviceArray):
            return np.array(array, dtype=dtype, copy=True)
        return array if dtype is None else array.astype(dtype, copy=False)

    def update_inplace(self, np_arr: np.ndarray) -> None:
        """Copy ``np_arr`` into this value (same shape and dtype)."""
        value = self._array
        if not isinstance(value, DeviceArray):
            np.copyto(value, np_arr, casting="no")
            return
        if not isinstance(np_arr, np.ndarray) or np_arr.shape != value.shape or np_arr.dtype != value.dtype:
            raise argument_error(
                "np_arr", f"an array of {value.dtype}{list(value.shape)}", np_arr, f"{_WHERE}.update_inplace"
            )
        host = np.ascontiguousarray(np_arr, dtype=value.tensor.dtype)
        value.owner.enqueue_write(value.owner.queue, value.tensor, host)

    def shape(self) -> list[int]:
        return list(self._array.shape)

    def data_type(self) -> str:
        """``tensor(float)`` for float32, as ONNX Runtime names types."""
        return type_name(self._array.dtype)

    def element_type(self) -> int:
        """The ONNX ``TensorProto`` number of the element type (1 for float32)."""
        return element_type(self._array.dtype)

    def device_name(self) -> str:
        return "opencl" if isinstance(self._array, DeviceArray) else "cpu"

    def data_ptr(self) -> int:
        """The address of the first element; a device value's buffer handle and offset (what
        ``IOBinding.bind_input`` takes for it)."""
        if isinstance(self._array, DeviceArray):
            return address(self._array)
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
