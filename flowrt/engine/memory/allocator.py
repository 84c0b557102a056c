"""Where arena bytes come from: the Allocator protocol and the host allocator."""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import numpy as np

# Cache-line alignment for host tensors; also what SIMD loads want.
HOST_ALIGNMENT = 64


@runtime_checkable
class Allocator(Protocol):
    """Allocates one arena: ``nbytes`` bytes whose start is ``alignment``-aligned.

    Returns a 1-D uint8 numpy array over the bytes (host memory) that the caller owns.
    """

    alignment: int

    def allocate(self, nbytes: int) -> np.ndarray: ...


class HostAllocator:
    """Host memory from numpy, aligned by over-allocating and slicing."""

    alignment = HOST_ALIGNMENT

    def allocate(self, nbytes: int) -> np.ndarray:
        raw = np.empty(nbytes + self.alignment, dtype=np.uint8)
        start = -raw.ctypes.data % self.alignment
        return raw[start : start + nbytes]


def align_up(value: int, alignment: int) -> int:
    return -(-value // alignment) * alignment
