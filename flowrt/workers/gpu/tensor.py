"""GpuTensor: a tensor in OpenCL device memory, as GpuAcc workloads hand them to each other."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from flowrt.workers.gpu.device import cl


class GpuTensor:
    """A C-contiguous tensor in an OpenCL buffer: the buffer, a shape and a dtype.

    ``get()`` copies it to a new numpy array (blocking); ``np.asarray(t)`` does the same, so a
    host kernel that reads a GpuTensor works unchanged. ``reshape`` is a view on the same
    buffer. The tensor keeps its buffer alive; it does not synchronize with kernels that are
    still writing it (GpuAcc workloads return only once their kernels have finished).
    """

    __slots__ = ("buffer", "dtype", "queue", "shape")

    def __init__(self, buffer: Any, shape: Sequence[int], dtype: Any, queue: Any) -> None:
        self.buffer = buffer
        self.shape = tuple(int(d) for d in shape)
        self.dtype = np.dtype(dtype)
        self.queue = queue

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))

    @property
    def nbytes(self) -> int:
        return self.size * self.dtype.itemsize

    def get(self) -> np.ndarray:
        """A host copy of the tensor; blocks until the copy is done."""
        host = np.empty(self.shape, self.dtype)
        if host.size:
            cl.enqueue_copy(self.queue, host, self.buffer, is_blocking=True)
        return host

    def __array__(self, dtype: Any = None, copy: bool | None = None) -> np.ndarray:
        host = self.get()
        return host if dtype is None else host.astype(dtype, copy=False)

    def reshape(self, *shape: Any) -> GpuTensor:
        """The same bytes seen with another shape of the same size."""
        dims = tuple(shape[0]) if len(shape) == 1 and isinstance(shape[0], (tuple, list)) else shape
        if int(np.prod(dims, dtype=np.int64)) != self.size:
            raise ValueError(f"cannot reshape a GpuTensor of shape {self.shape} to {tuple(dims)}")
        return GpuTensor(self.buffer, dims, self.dtype, self.queue)

    def __repr__(self) -> str:
        return f"GpuTensor(shape={self.shape}, dtype={self.dtype})"
