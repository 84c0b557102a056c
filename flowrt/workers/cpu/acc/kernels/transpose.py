"""Transpose, any permutation, any data type: the output walked as rows gathered from the input.

Dimensions that stay neighbours in the same order are merged first (``strided.collapse``):
shufflenet's channel shuffle, ``(1, 4, 60, 28, 28)`` by ``(0, 2, 1, 3, 4)``, becomes
``60 x 4`` rows of ``784`` contiguous elements, each one straight copy. When the last
dimension moves, each output row gathers with the input's stride instead.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from flowrt.engine.graph.layers.transpose import transpose_perm
from flowrt.errors import BackendError
from flowrt.registry import Support, WorkloadInfo
from flowrt.workers.cpu.acc.calls import NATIVE, SliceFunction
from flowrt.workers.cpu.acc.kernels import acc_kernel
from flowrt.workers.cpu.acc.kernels.strided import (
    as_index,
    as_words,
    collapse,
    contiguous_strides,
    has_word_size,
    row_bounds,
    row_offset,
)


@njit(nogil=True, cache=True)
def _gather_rows(x, out, outer, in_strides, step, inner, first, last):
    """Output rows ``first`` to ``last``, each ``inner`` input elements ``step`` apart."""
    for r in range(first, last):
        src = row_offset(r, outer, in_strides)
        d = out[r * inner : (r + 1) * inner]
        if step == 1:
            s = x[src : src + inner]
            for j in range(inner):
                d[j] = s[j]
        else:
            for j in range(inner):
                d[j] = x[src + j * step]


@njit(**NATIVE)
def _transpose_slice(s, _step, bounds, x, out, outer, in_strides, step, inner):
    """Slice ``s`` of :data:`_TRANSPOSE` (a ``SliceFunction``): rows ``bounds[s]`` to
    ``bounds[s + 1]``."""
    _gather_rows(x, out, outer, in_strides, step, inner, bounds[s], bounds[s + 1])


_TRANSPOSE = SliceFunction(_transpose_slice)


def _transpose(x, out, outer, in_strides, step, inner, bounds):
    """Every slice of ``bounds``, spread over the workers (one on the calling thread)."""
    _TRANSPOSE.run(bounds.shape[0] - 1, (bounds, x, out, outer, in_strides, step, inner))


class PermutedWalk:
    """The output of a permutation of ``shape`` as rows: an ``outer`` grid of rows of
    ``inner`` elements, each starting at a ``row_offset`` in the input and stepping ``step``."""

    def __init__(self, shape, perm, workers: int) -> None:
        own = contiguous_strides(shape)
        out_shape = [shape[p] for p in perm]
        dims, (in_strides, _) = collapse(out_shape, [own[p] for p in perm], contiguous_strides(out_shape))
        self.shape = tuple(out_shape)
        self.inner, self.step = dims[-1], in_strides[-1]
        self.outer, self.in_strides = as_index(dims[:-1]), as_index(in_strides[:-1])
        self.bounds = row_bounds(int(np.prod(dims[:-1])), self.inner, workers)


@acc_kernel("Transpose")
class TransposeKernel:
    """Transpose split into row slices across the CPU workers."""

    @classmethod
    def supports(cls, info: WorkloadInfo) -> Support:
        x = info.inputs[0]
        if x is None or not has_word_size(x.dtype.numpy):
            return Support.no("CpuAcc Transpose takes data types of 1, 2, 4 or 8 bytes only")
        return Support.yes()

    def __init__(self, info: WorkloadInfo, workers: int) -> None:
        if info.activation is not None:
            raise BackendError(f"CpuAcc Transpose {info.layer_name!r} cannot apply a fused activation")
        self.info = info
        self.workers = workers
        self._walks: dict[tuple[int, ...], PermutedWalk] = {}

    def walk(self, shape: tuple[int, ...]) -> PermutedWalk:
        """The walk for an input shape (planned once per shape)."""
        cached = self._walks.get(shape)
        if cached is None:
            perm = transpose_perm(self.info.descriptor.perm, len(shape))
            cached = self._walks[shape] = PermutedWalk(shape, perm, self.workers)
        return cached

    def execute(self, inputs, outputs=None):
        x = np.asarray(inputs[0], order="C")
        walk = self.walk(x.shape)
        out = np.empty(walk.shape, x.dtype) if outputs is None else outputs[0]
        if out.size:
            w = walk
            _transpose(as_words(x), as_words(out), w.outer, w.in_strides, w.step, w.inner, w.bounds)
        return [out]
