"""GpuTensor: a tensor in OpenCL device memory, as GpuAcc workloads hand them to each other."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from flowrt.workers.gpu.device import cl


class GpuTensor:
    """A C-contiguous tensor in an OpenCL buffer: the buffer, where in it, a shape and a dtype.

    ``buffer`` is a buffer of the tensor's own, or a pool arena's one buffer, the tensor then
    starting ``offset`` bytes into it (the planner aligns offsets to the device's base-address
    alignment). Kernels take each tensor as ``kernel_args``: the buffer and the offset of its
    first element, in elements (see common.cl). ``get()`` copies it to a new numpy array,
    blocking on ``queue``; ``np.asarray(t)`` does the same. ``enqueue_read`` is the
    non-blocking copy a queue actor orders after the kernels that write the tensor.
    ``reshape`` is a view on the same bytes, which keeps the tensor it views alive (``base``):
    a buffer that goes back to a cache when its tensor is dropped (an uploaded feed's) stays
    out of it while a view is in use. The tensor keeps its buffer alive; it does not
    synchronize with commands on other queues still writing it.
    """

    __slots__ = ("__weakref__", "base", "buffer", "dtype", "kernel_args", "offset", "queue", "shape", "size")

    def __init__(self, buffer: Any, shape: Sequence[int], dtype: Any, queue: Any, offset: int = 0) -> None:
        self.buffer = buffer
        self.shape = tuple(int(d) for d in shape)
        self.dtype = np.dtype(dtype)
        self.queue = queue
        self.size = math.prod(self.shape)  # read per enqueue: computed once
        self.offset = offset
        if offset % self.dtype.itemsize:
            raise ValueError(f"a {self.dtype} tensor cannot start at byte {offset} of its buffer")
        self.kernel_args = (buffer, np.int32(offset // self.dtype.itemsize))
        self.base: GpuTensor | None = None  # the tensor a view sees the bytes of

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def nbytes(self) -> int:
        return self.size * self.dtype.itemsize

    def get(self) -> np.ndarray:
        """A host copy of the tensor; blocks until the copy is done."""
        host = np.empty(self.shape, self.dtype)
        if host.size:
            cl.enqueue_copy(self.queue, host, self.buffer, src_offset=self.offset, is_blocking=True)
        return host

    def enqueue_read(self, queue: Any, into: np.ndarray | None = None) -> tuple[np.ndarray, Any]:
        """Enqueue a copy to a host array (``into``, C-contiguous of this shape and dtype, or a
        new one) on ``queue``, without waiting: the array holds the tensor once the returned
        event has completed. Keep the event until then — pyopencl ties the array's lifetime to
        it, and dropping it early blocks until the copy is done."""
        host = np.empty(self.shape, self.dtype) if into is None else into
        return host, cl.enqueue_copy(queue, host, self.buffer, src_offset=self.offset, is_blocking=False)

    def __array__(self, dtype: Any = None, copy: bool | None = None) -> np.ndarray:
        host = self.get()
        return host if dtype is None else host.astype(dtype, copy=False)

    def reshape(self, *shape: Any) -> GpuTensor:
        """The same bytes seen with another shape of the same size."""
        dims = tuple(shape[0]) if len(shape) == 1 and isinstance(shape[0], (tuple, list)) else shape
        if int(np.prod(dims, dtype=np.int64)) != self.size:
            raise ValueError(f"cannot reshape a GpuTensor of shape {self.shape} to {tuple(dims)}")
        view = GpuTensor(self.buffer, dims, self.dtype, self.queue, self.offset)
        view.base = self if self.base is None else self.base
        return view

    def __repr__(self) -> str:
        return f"GpuTensor(shape={self.shape}, dtype={self.dtype})"
