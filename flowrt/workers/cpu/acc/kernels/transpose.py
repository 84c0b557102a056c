"""Transpose, any permutation, any data type: the output walked as rows gathered from the input.

Dimensions that stay neighbours in the same order are merged first (``strided.collapse``):
shufflenet's channel shuffle, ``(1, 4, 60, 28, 28)`` by ``(0, 2, 1, 3, 4)``, becomes
``60 x 4`` rows of ``784`` contiguous elements, each one straight copy. When the last
dimension moves, each output row gathers with the input's stride instead, in blocks of rows
where the rows start at neighbouring input elements (attention's K transposed, (1, 6, 197,
64) by (0, 1, 3, 2), one Zen 5 core: 37.9 -> 21.3 us).
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

# Output rows gathered together where neighbouring rows start at neighbouring input
# elements (a 2-D transpose inside the permutation), and columns per pass over them: each
# input cache line read is then used whole, a block of BLOCK x BLOCK elements at a time.
BLOCK = 16


@njit(nogil=True, cache=True)
def _gather_rows(x, out, outer, in_strides, step, inner, first, last):
    """Output rows ``first`` to ``last``, each ``inner`` input elements ``step`` apart. Where
    the last outer dimension steps one element in the input (``in_strides[-1] == 1``) and
    the rows gather (``step`` > 1), up to ``BLOCK`` rows run together: for each of their
    columns one contiguous run of the input fills that column of every row."""
    run = outer[outer.shape[0] - 1]
    blocked = step != 1 and in_strides[in_strides.shape[0] - 1] == 1 and run > 1
    r = first
    while r < last:
        src = row_offset(r, outer, in_strides)
        if blocked:
            rows = min(BLOCK, run - r % run, last - r)
            for j0 in range(0, inner, BLOCK):
                for j in range(j0, min(j0 + BLOCK, inner)):
                    s = np.uint64(src + j * step)
                    d = np.uint64(r * inner + j)
                    for i in range(rows):
                        out[d + np.uint64(i * inner)] = x[s + np.uint64(i)]
            r += rows
            continue
        # by unsigned index of the whole arrays: a view of each row (a slice) cost about as
        # much as copying an attention head's row of 64 values
        d, s = np.uint64(r * inner), np.uint64(src)
        if step == 1:
            for j in range(np.uint64(inner)):
                out[d + j] = x[s + j]
        else:
            for j in range(inner):
                out[d + np.uint64(j)] = x[s + np.uint64(j * step)]
        r += 1


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
