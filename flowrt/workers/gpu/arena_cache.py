"""Where GpuAcc's arena buffers wait for the next load (see ``allocator`` for why)."""

from __future__ import annotations

import ctypes
import threading
from typing import Any

import numpy as np

from flowrt.workers.gpu.tensor import GpuTensor

# An arena's tensor views (the arena's buffer at an offset), by (offset, shape, dtype).
Views = dict[tuple[int, tuple[int, ...], np.dtype], GpuTensor]


class ArenaCache:
    """The device buffers of arenas that no pool holds any more, with their views, by size."""

    def __init__(self) -> None:
        self._free: list[tuple[Any, Views]] = []
        # Kept past the interpreter's exit too (one reference that is never dropped): releasing
        # buffers at exit made NVIDIA's driver crash when pools' tensors were sub-buffers, and
        # costs a wait for the device besides. The operating system reclaims the device memory
        # with the process.
        ctypes.pythonapi.Py_IncRef(ctypes.py_object(self._free))
        # Serializes takers only. ``give`` takes no lock: a tensor's finalizer gives its buffer
        # back, and the cyclic garbage collector may run that finalizer inside ``take``, on the
        # thread that holds the lock. An append is atomic and leaves the indices ``take`` holds
        # valid.
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._free)

    def take(self, nbytes: int) -> tuple[Any, Views] | None:
        """The smallest cached buffer of ``nbytes`` to twice that, or None."""
        with self._lock:
            fits = [i for i, (b, _) in enumerate(self._free) if nbytes <= b.size <= 2 * nbytes]
            if not fits:
                return None
            return self._free.pop(min(fits, key=lambda i: self._free[i][0].size))

    def give(self, buffer: Any, views: Views) -> None:
        """Keep ``buffer`` for a later ``take``; never waits (see ``__init__``)."""
        self._free.append((buffer, views))
