"""DeviceArray: a tensor that stays in a device's memory between runs (ONNX Runtime's IOBinding
on a GPU, PyTorch's CUDA tensors): fed to a run where a numpy array would be, and returned
by one for the outputs asked to stay on the device."""

from __future__ import annotations

from typing import Any

import numpy as np


class DeviceArray:
    """A tensor in the memory of the device a network's layers run on (GpuAcc's).

    ``model.device_array(array)`` copies a host array there; ``model.run(feeds,
    device_outputs=True)`` returns the outputs made on the device as new DeviceArrays. A run
    reads a DeviceArray feed where it is, with no copy from the host, and a device output is
    copied within the device only (the run's own memory is reused by the next run). It has a
    ``shape`` and a ``dtype`` as a feed is checked by; ``numpy()`` (or ``np.asarray``) copies
    it to a new host array, blocking until the copy is done.

    ``tensor`` is the backend's device tensor and ``owner`` the backend context that made it:
    a run takes a DeviceArray only on that device.
    """

    __slots__ = ("__weakref__", "dtype", "owner", "shape", "tensor")

    def __init__(self, tensor: Any, owner: Any, dtype: Any = None) -> None:
        self.tensor = tensor
        self.owner = owner
        self.shape = tuple(tensor.shape)
        # The dtype it stands for: a feed's as given (the device may store it otherwise).
        self.dtype = np.dtype(tensor.dtype if dtype is None else dtype)

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))

    @property
    def nbytes(self) -> int:
        """The bytes it stands for (``size`` elements of ``dtype``)."""
        return self.size * self.dtype.itemsize

    def numpy(self) -> np.ndarray:
        """A host copy, of ``dtype``; blocks until the copy is done."""
        return np.asarray(self.tensor.get()).astype(self.dtype, copy=False)

    def __array__(self, dtype: Any = None, copy: bool | None = None) -> np.ndarray:
        host = self.numpy()
        return host if dtype is None else host.astype(dtype, copy=False)

    def __repr__(self) -> str:
        return f"DeviceArray(shape={self.shape}, dtype={self.dtype})"
