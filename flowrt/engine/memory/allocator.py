"""Where arena bytes come from: the Allocator protocol and the host allocator."""

from __future__ import annotations

import math
from typing import Any, Protocol, runtime_checkable

import numpy as np

# Cache-line alignment for host tensors; also what SIMD loads want.
HOST_ALIGNMENT = 64
PAGE_SIZE = 4096


@runtime_checkable
class Allocator(Protocol):
    """Allocates one arena of ``nbytes`` bytes and makes tensors at offsets in it.

    ``alignment`` is what every tensor offset the planner hands out is a multiple of.
    ``allocate`` returns the arena, which the caller owns: host memory (a 1-D uint8 numpy
    array) or any object with an ``nbytes`` attribute (a device buffer). ``view`` and
    ``zero`` are optional; without them an arena must be a host array, viewed and zeroed as
    :class:`HostAllocator` does.
    """

    alignment: int

    def allocate(self, nbytes: int) -> Any: ...


class HostAllocator:
    """Host memory from numpy, aligned by over-allocating and slicing."""

    alignment = HOST_ALIGNMENT

    def allocate(self, nbytes: int) -> np.ndarray:
        raw = np.empty(nbytes + self.alignment, dtype=np.uint8)
        # One write per page: the OS maps the pages now, at load, not in the first run.
        raw[::PAGE_SIZE] = 0
        start = -raw.ctypes.data % self.alignment
        return raw[start : start + nbytes]

    @staticmethod
    def view(arena: np.ndarray, offset: int, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
        """The tensor of ``shape``/``dtype`` stored at byte ``offset`` of ``arena``."""
        nbytes = math.prod(shape) * dtype.itemsize
        return arena[offset : offset + nbytes].view(dtype).reshape(shape)

    @staticmethod
    def zero(arena: np.ndarray) -> None:
        arena.fill(0)


def align_up(value: int, alignment: int) -> int:
    return -(-value // alignment) * alignment
