"""Gather along any axis: int32 or int64 indices (negative ones count from the end), scalar
indices too, any data type of 1, 2, 4 or 8 bytes.

Seen from the axis, the data is ``outer`` blocks of ``dim`` rows of ``inner`` elements and the
output ``outer`` blocks of one row per index. An embedding lookup (a constant ``(V, H)`` table,
``(B, S)`` token ids) is ``B*S`` rows of ``H`` contiguous elements; the shape arithmetic of a
transformer export (``Gather(Shape(x), 0)``) is one element. Indices are checked and made
non-negative first, once at load when they are constants.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np
from numba import njit

from flowrt.engine.graph.shapes import normalize_axis
from flowrt.errors import BackendError, ShapeError
from flowrt.registry import Support, WorkloadInfo
from flowrt.workers.cpu.acc.calls import NATIVE, SliceFunction
from flowrt.workers.cpu.acc.kernels import acc_kernel
from flowrt.workers.cpu.acc.kernels.strided import as_words, movable_data, row_bounds


@njit(nogil=True, cache=True)
def _wrap_indices(indices, dim, out):
    """``out`` = ``indices`` with the negative ones counted from the end of ``dim``; the
    position of the first index outside ``[-dim, dim)``, or -1 when all fit."""
    for k in range(indices.shape[0]):
        i = np.int64(indices[k])
        if i < 0:
            i += dim
        if i < 0 or i >= dim:
            return k
        out[k] = i
    return -1


@njit(nogil=True, cache=True)
def _gather_rows(x, indices, out, dim, inner, first, last):
    """Output rows ``first`` to ``last``: row ``r`` is row ``indices[r % n]`` of data block
    ``r // n`` (``n`` indices, ``inner`` elements a row)."""
    n = indices.shape[0]
    for r in range(first, last):
        block = r // n
        src = (block * dim + indices[r - block * n]) * inner
        s = x[src : src + inner]
        d = out[r * inner : (r + 1) * inner]
        for j in range(inner):
            d[j] = s[j]


@njit(**NATIVE)
def _gather_slice(s, _step, bounds, x, indices, out, dim, inner):
    """Slice ``s`` of :data:`_GATHER` (a ``SliceFunction``)."""
    _gather_rows(x, indices, out, dim, inner, bounds[s], bounds[s + 1])


_GATHER = SliceFunction(_gather_slice)


def _gather(x, indices, out, dim, inner, bounds):
    """Every slice of ``bounds``, spread over the workers."""
    _GATHER.run(bounds.shape[0] - 1, (bounds, x, indices, out, dim, inner))


def wrapped_indices(indices: np.ndarray, dim: int) -> np.ndarray:
    """``indices`` flattened to int64 with negative ones counted from the end; ShapeError
    naming the first one outside ``[-dim, dim)``."""
    flat = np.ascontiguousarray(indices).reshape(-1)
    out = np.empty(flat.shape[0], np.int64)
    bad = _wrap_indices(flat, dim, out)
    if bad >= 0:
        raise ShapeError(f"Gather: indices in [{-dim}, {dim}) expected, got {int(flat[bad])}")
    return out


class GatherLayout(NamedTuple):
    """A Gather seen from its axis: the output ``shape``, the axis length ``dim``, the
    ``inner`` elements a row, the ``rows`` of the output and their slices across workers."""

    shape: tuple[int, ...]
    dim: int
    inner: int
    rows: int
    bounds: np.ndarray


@acc_kernel("Gather")
class GatherKernel:
    """Gather as rows copied from the data, split into row slices across the CPU workers."""

    @classmethod
    def supports(cls, info: WorkloadInfo) -> Support:
        return movable_data(info)

    def __init__(self, info: WorkloadInfo, workers: int) -> None:
        if info.activation is not None:
            raise BackendError(f"CpuAcc Gather {info.layer_name!r} cannot apply a fused activation")
        self.info = info
        self.workers = workers
        constants = list(info.constants) + [None, None]
        self.constant_indices = constants[1]
        # Constant indices are wrapped once per axis length: a run then reads them as they are.
        self._wrapped: dict[int, np.ndarray] = {}
        self._layouts: dict[tuple[tuple[int, ...], tuple[int, ...]], GatherLayout] = {}

    def indices(self, indices: np.ndarray, dim: int) -> np.ndarray:
        """The run's indices, flat int64 and non-negative."""
        if self.constant_indices is None:
            return wrapped_indices(indices, dim)
        cached = self._wrapped.get(dim)
        if cached is None:
            cached = self._wrapped[dim] = wrapped_indices(self.constant_indices, dim)
        return cached

    def layout(self, shape: tuple[int, ...], index_shape: tuple[int, ...]) -> GatherLayout:
        """The layout for a data shape and an indices shape (worked out once per pair)."""
        key = (shape, index_shape)
        cached = self._layouts.get(key)
        if cached is None:
            axis = normalize_axis(self.info.descriptor.axis, len(shape), "Gather")
            inner = math.prod(shape[axis + 1 :])
            rows = math.prod(shape[:axis]) * math.prod(index_shape)
            cached = self._layouts[key] = GatherLayout(
                shape[:axis] + index_shape + shape[axis + 1 :],
                shape[axis],
                inner,
                rows,
                row_bounds(rows, inner, self.workers),
            )
        return cached

    def execute(self, inputs, outputs=None):
        x = np.asarray(inputs[0], order="C")
        layout = self.layout(x.shape, np.shape(inputs[1]))
        indices = self.indices(inputs[1], layout.dim)
        out = np.empty(layout.shape, x.dtype) if outputs is None else outputs[0]
        if out.size == 0:
            return [out]
        args = (as_words(x), indices, as_words(out), layout.dim, layout.inner)
        if layout.bounds.shape[0] > 2:
            _gather(*args, layout.bounds)
        else:
            _gather_rows(*args, 0, layout.rows)
        return [out]
