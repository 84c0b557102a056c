"""Strided walks shared by the data-movement kernels: a tensor seen as rows of contiguous runs.

An output is walked row by row: its last (collapsed) dimension is the row, every other
dimension an outer index. ``collapse`` merges the dimensions that every operand steps through
the same way, so that a broadcast Add of a ``(C, 1, 1)`` constant becomes ``C`` rows of ``H*W``
and shufflenet's ``(0, 2, 1, 3, 4)`` transpose becomes ``60 x 4`` rows of ``28*28`` elements.
``row_offset`` finds a row's start in an operand inside a jitted loop.
``StridedCopy`` is the one copy that Slice, Expand, Tile and Split all reduce to.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np
from numba import njit

from flowrt.engine.scheduler.window import SplitHint, split_bounds
from flowrt.registry import Support, WorkloadInfo
from flowrt.workers.cpu.acc.calls import SliceFunction
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


def as_index(values: Iterable[int]) -> np.ndarray:
    """An int64 array a jitted loop reads shapes and strides from (never empty)."""
    return np.array(list(values) or [1], dtype=np.int64)


def row_bounds(rows: int, row_length: int, workers: int) -> np.ndarray:
    """Slice boundaries over ``rows`` rows, each slice at least ``MIN_SLICE`` elements."""
    hint = SplitHint(axis=0, min_slice=max(1, MIN_SLICE // max(row_length, 1)))
    return split_bounds(rows, hint, workers)


class FlatSplits:
    """Slice boundaries over a flat run of elements for ``workers``, each slice at least
    ``MIN_SLICE`` elements (:func:`row_bounds` of rows of one), computed once per size: a
    kernel's, over the sizes it is run with."""

    def __init__(self, workers: int) -> None:
        self.workers = workers
        self._bounds: dict[int, np.ndarray] = {}

    def __call__(self, size: int) -> np.ndarray:
        cached = self._bounds.get(size)
        if cached is None:
            cached = self._bounds[size] = row_bounds(size, 1, self.workers)
        return cached


def as_words(x: np.ndarray) -> np.ndarray:
    """``x`` (C-contiguous) seen as unsigned integers of its item size: one compiled copy
    loop then moves any data type."""
    return x.reshape(-1).view(_WORDS[x.dtype.itemsize])


def has_word_size(dtype: np.dtype) -> bool:
    """Whether ``as_words`` can view arrays of ``dtype``: numpy's own types only (ml_dtypes'
    low-precision ones are user-defined, isbuiltin 2, whatever numpy kind they claim)."""
    return dtype.itemsize in _WORDS and dtype.kind not in "OUSV" and dtype.isbuiltin == 1


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


# Elements per row when a walk collapses to one flat run: rows are what the workers split.
FLAT_ROW = 4096


def cut_flat(
    dims: list[int], steps: list[list[int]], row: int = FLAT_ROW
) -> tuple[list[int], list[list[int]]]:
    """A one-dimension walk (what ``collapse`` leaves of equal shapes) cut into rows of
    ``row`` elements, the last one shorter, so that it can be split across workers; any
    other walk as it is."""
    if len(dims) != 1 or dims[0] <= row:
        return dims, steps
    return [-(-dims[0] // row), row], [[s[0] * row, s[0]] for s in steps]


@njit(nogil=True, cache=True)
def copy_rows(x, base, out, outer, in_strides, step, inner, first, last):
    """Output rows ``first`` to ``last`` of ``inner`` elements (the last row of ``out`` may be
    shorter): row ``r`` reads ``x`` from ``base + row_offset(r, outer, in_strides)`` on,
    ``step`` elements apart (0: one value repeated, negative: backwards)."""
    size = out.shape[0]
    for r in range(first, last):
        lo = r * inner
        n = min(inner, size - lo)
        src = base + row_offset(r, outer, in_strides)
        d = out[lo : lo + n]
        if step == 1:
            s = x[src : src + n]
            for j in range(n):
                d[j] = s[j]
        elif step == 0:
            v = x[src]
            for j in range(n):
                d[j] = v
        else:
            for j in range(n):
                d[j] = x[src + j * step]


@njit(nogil=True, cache=True)
def _copy_slice(task, _step, x, base, out, outer, in_strides, step, inner, bounds):
    """Slice ``task`` of a :class:`StridedCopy` (a :class:`SliceFunction`)."""
    copy_rows(x, base, out, outer, in_strides, step, inner, bounds[task], bounds[task + 1])


_COPY_SLICE = SliceFunction(_copy_slice)


class StridedCopy:
    """A C-contiguous output of ``shape`` whose element ``(i_0, ..., i_n)`` is the input's
    element ``base + sum(i_d * strides[d])``: a Slice (negative strides for negative steps),
    an Expand (0 where it repeats), a Tile or a piece of a Split. Planned once per shape;
    ``run`` copies on one thread when the work is too small to split."""

    def __init__(self, shape: Sequence[int], strides: Sequence[int], base: int, workers: int) -> None:
        dims, (steps,) = cut_flat(*collapse(shape, strides))
        self.shape = tuple(int(n) for n in shape)
        self.base = int(base)
        self.inner, self.step = dims[-1], steps[-1]
        self.outer, self.in_strides = as_index(dims[:-1]), as_index(steps[:-1])
        self.rows = int(np.prod(dims[:-1], dtype=np.int64))
        self.bounds = row_bounds(self.rows, self.inner, workers)

    def run(self, x: np.ndarray, out: np.ndarray) -> None:
        """Fill ``out`` (flat words, ``as_words``) from ``x`` (flat words of the same type)."""
        args = (x, self.base, out, self.outer, self.in_strides, self.step, self.inner)
        if self.bounds.shape[0] > 2:
            _COPY_SLICE.run(self.bounds.shape[0] - 1, (*args, self.bounds))
        else:
            copy_rows(*args, 0, self.rows)


def movable_data(info: WorkloadInfo) -> Support:
    """Support.yes when the layer's data input (its first) is present and ``as_words`` can
    move its data type; the reason otherwise."""
    x = info.inputs[0] if info.inputs else None
    if x is None or not has_word_size(x.dtype.numpy):
        return Support.no(f"CpuAcc {info.kind} takes a data input of 1, 2, 4 or 8 bytes a value only")
    return Support.yes()
