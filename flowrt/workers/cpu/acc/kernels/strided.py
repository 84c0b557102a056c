"""Strided walks shared by the data-movement kernels: a tensor seen as rows of contiguous runs.

An output is walked row by row: its last (collapsed) dimension is the row, every other
dimension an outer index. ``collapse`` merges the dimensions that every operand steps through
the same way, so that a broadcast Add of a ``(C, 1, 1)`` constant becomes ``C`` rows of ``H*W``
and shufflenet's ``(0, 2, 1, 3, 4)`` transpose becomes ``60 x 4`` rows of ``28*28`` elements.
``row_offset`` finds a row's start in an operand inside a jitted loop.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from numba import njit

from flowrt.engine.scheduler.window import SplitHint, split_bounds
from flowrt.workers.cpu.acc.kernels.activation import MIN_SLICE

_WORDS = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}


def contiguous_strides(shape: Sequence[int]) -> list[int]:
    """Element (not byte) strides of a C-contiguous array of ``shape``."""
    strides, step = [], 1
    for n in reversed(shape):
        strides.append(step)
        step *= int(n)
    return strides[::-1]


def broadcast_strides(shape: Sequence[int], out_shape: Sequence[int]) -> list[int]:
    """Element strides that walk a C-contiguous ``shape`` broadcast to ``out_shape`` (0 where
    it repeats)."""
    pad = len(out_shape) - len(shape)
    own = contiguous_strides(shape)
    return [0] * pad + [0 if n == 1 else s for n, s in zip(shape, own, strict=True)]


def collapse(shape: Sequence[int], *strides: Sequence[int]) -> tuple[list[int], list[list[int]]]:
    """``shape`` with its size-1 dimensions dropped and each run of dimensions that every
    operand walks contiguously merged into one; at least one dimension is left."""
    kept = [i for i, n in enumerate(shape) if n != 1] or [len(shape)]
    dims = [int(shape[i]) if i < len(shape) else 1 for i in kept]
    steps = [[int(s[i]) if i < len(shape) else 0 for i in kept] for s in strides]
    out_dims, out_steps = [dims[0]], [[s[0]] for s in steps]
    for d in range(1, len(dims)):
        if all(s[d - 1] == s[d] * dims[d] for s in steps):
            out_dims[-1] *= dims[d]
            for merged, s in zip(out_steps, steps, strict=True):
                merged[-1] = s[d]
        else:
            out_dims.append(dims[d])
            for merged, s in zip(out_steps, steps, strict=True):
                merged.append(s[d])
    return out_dims, out_steps


def as_index(values: Sequence[int]) -> np.ndarray:
    """An int64 array a jitted loop reads shapes and strides from (never empty)."""
    return np.array(list(values) or [1], dtype=np.int64)


def row_bounds(rows: int, row_length: int, workers: int) -> np.ndarray:
    """Slice boundaries over ``rows`` rows, each slice at least ``MIN_SLICE`` elements."""
    hint = SplitHint(axis=0, min_slice=max(1, MIN_SLICE // max(row_length, 1)))
    return split_bounds(rows, hint, workers)


def as_words(x: np.ndarray) -> np.ndarray:
    """``x`` (C-contiguous) seen as unsigned integers of its item size: one compiled copy
    loop then moves any data type."""
    return x.reshape(-1).view(_WORDS[x.dtype.itemsize])


def has_word_size(dtype: np.dtype) -> bool:
    """Whether ``as_words`` can view arrays of ``dtype``."""
    return dtype.itemsize in _WORDS and dtype.kind not in "OUSV"


@njit(nogil=True, cache=True)
def row_offset(row, outer, strides):
    """Where row ``row`` of an ``outer``-shaped grid of rows starts, for an operand that steps
    ``strides[d]`` elements per index of outer dimension ``d``."""
    offset = 0
    for d in range(outer.shape[0] - 1, -1, -1):
        n = outer[d]
        offset += (row % n) * strides[d]
        row //= n
    return offset
