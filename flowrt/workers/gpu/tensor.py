"""GpuTensor: a tensor in OpenCL device memory, as GpuAcc workloads hand them to each other."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from flowrt.workers.gpu.device import cl


class GpuTensor:
    """A C-contiguous tensor in an OpenCL buffer: the buffer, a shape and a dtype.

    ``buffer`` is a whole ``cl.Buffer`` or a sub-buffer of a pool arena (a tensor at an
    offset, which the planner aligns to the device's base-address alignment). ``get()``
    copies it to a new numpy array, blocking on ``queue``; ``np.asarray(t)`` does the same.
    ``enqueue_read`` is the non-blocking copy a queue actor orders after the kernels that
    write the tensor. ``reshape`` is a view on the same buffer. The tensor keeps its buffer
    alive; it does not synchronize with commands on other queues still writing it.
    ``base`` and ``offset``: the arena buffer a pool's tensor is a sub-buffer of, and where
    in it (None and 0 for a buffer of its own), so that a kernel can tell that two tensors
    share bytes (a Concat input written in place by its producer).
    """

    __slots__ = ("__weakref__", "base", "buffer", "dtype", "offset", "queue", "shape", "size")

    def __init__(
        self, buffer: Any, shape: Sequence[int], dtype: Any, queue: Any, base: Any = None, offset: int = 0
    ) -> None:
        self.buffer = buffer
        self.shape = tuple(int(d) for d in shape)
        self.dtype = np.dtype(dtype)
        self.queue = queue
        self.size = math.prod(self.shape)  # read per enqueue: computed once
        self.base = base
        self.offset = offset

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
            cl.enqueue_copy(self.queue, host, self.buffer, is_blocking=True)
        return host

    def enqueue_read(self, queue: Any, into: np.ndarray | None = None) -> tuple[np.ndarray, Any]:
        """Enqueue a copy to a host array (``into``, C-contiguous of this shape and dtype, or a
        new one) on ``queue``, without waiting: the array holds the tensor once the returned
        event has completed. Keep the event until then — pyopencl ties the array's lifetime to
        it, and dropping it early blocks until the copy is done."""
        host = np.empty(self.shape, self.dtype) if into is None else into
        return host, cl.enqueue_copy(queue, host, self.buffer, is_blocking=False)

    def __array__(self, dtype: Any = None, copy: bool | None = None) -> np.ndarray:
        host = self.get()
        return host if dtype is None else host.astype(dtype, copy=False)

    def reshape(self, *shape: Any) -> GpuTensor:
        """The same bytes seen with another shape of the same size."""
        dims = tuple(shape[0]) if len(shape) == 1 and isinstance(shape[0], (tuple, list)) else shape
        if int(np.prod(dims, dtype=np.int64)) != self.size:
            raise ValueError(f"cannot reshape a GpuTensor of shape {self.shape} to {tuple(dims)}")
        return GpuTensor(self.buffer, dims, self.dtype, self.queue, self.base, self.offset)

    def __repr__(self) -> str:
        return f"GpuTensor(shape={self.shape}, dtype={self.dtype})"
