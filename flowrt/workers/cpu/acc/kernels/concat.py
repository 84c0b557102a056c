"""Concat: each input copied into its band of the output, any axis, any data type.

Seen from the axis, every input is ``outer`` rows of ``width`` elements and the output
``outer`` rows of ``total``; input ``i`` fills columns ``[column_i, column_i + width_i)``. One
parallel region per input cuts its elements into one slice per worker, so that a channel Concat
of a single image (``outer`` = 1) still spreads across workers.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

from flowrt.engine.graph.shapes import normalize_axis
from flowrt.errors import BackendError
from flowrt.registry import Support, WorkloadInfo
from flowrt.workers.cpu.acc.calls import NATIVE, SliceFunction
from flowrt.workers.cpu.acc.kernels import acc_kernel
from flowrt.workers.cpu.acc.kernels.strided import FlatSplits, as_words, has_word_size


@njit(nogil=True, cache=True)
def _copy_band(src, out, width, total, column, first, last):
    """Elements ``first`` to ``last`` of ``src`` (rows of ``width``) into ``out`` (rows of
    ``total``) from ``column`` on."""
    e = first
    while e < last:
        row = e // width
        col = e - row * width
        n = min(width - col, last - e)
        start = row * total + column + col
        s = src[e : e + n]
        d = out[start : start + n]
        for j in range(n):
            d[j] = s[j]
        e += n


@njit(**NATIVE)
def _concat_slice(s, _step, bounds, src, out, width, total, column):
    """Slice ``s`` of :data:`_CONCAT` (a ``SliceFunction``)."""
    _copy_band(src, out, width, total, column, bounds[s], bounds[s + 1])


_CONCAT = SliceFunction(_concat_slice)


def _concat_part(src, out, width, total, column, bounds):
    """Every slice of ``bounds``, spread over the workers (one on the calling thread)."""
    _CONCAT.run(bounds.shape[0] - 1, (bounds, src, out, width, total, column))


@acc_kernel("Concat")
class ConcatKernel:
    """Concat along any axis, one parallel copy per input."""

    @classmethod
    def supports(cls, info: WorkloadInfo) -> Support:
        first = info.inputs[0] if info.inputs else None
        if first is None or any(x is None for x in info.inputs):
            return Support.no("CpuAcc Concat takes present inputs only")
        if not has_word_size(first.dtype.numpy):
            return Support.no("CpuAcc Concat takes data types of 1, 2, 4 or 8 bytes only")
        return Support.yes()

    def __init__(self, info: WorkloadInfo, workers: int) -> None:
        if info.activation is not None:
            raise BackendError(f"CpuAcc Concat {info.layer_name!r} cannot apply a fused activation")
        self.info = info
        self.workers = workers
        self.bounds = FlatSplits(workers)  # slice boundaries over a size, once per size
        self._layouts: dict[tuple[tuple[int, ...], ...], tuple[tuple[int, ...], int, list[int]]] = {}

    def layout(self, shapes: tuple[tuple[int, ...], ...]) -> tuple[tuple[int, ...], int, list[int]]:
        """The output shape, ``outer`` and each input's ``width`` for these input shapes
        (worked out once per shapes: a run's cost per Concat is mostly this glue)."""
        cached = self._layouts.get(shapes)
        if cached is None:
            axis = normalize_axis(self.info.descriptor.concat_axis, len(shapes[0]), "Concat")
            shape = list(shapes[0])
            shape[axis] = sum(s[axis] for s in shapes)
            outer = math.prod(shape[:axis])
            widths = [math.prod(s[axis:]) for s in shapes]
            cached = self._layouts[shapes] = (tuple(shape), outer, widths)
        return cached

    def in_place(self, inputs, out: np.ndarray) -> bool:
        """Whether every one of ``inputs`` lies in its band of ``out`` already (written there by
        its producer): then there is nothing to copy."""
        shapes = tuple(x.shape for x in inputs)
        _, outer, widths = self.layout(shapes)
        if outer != 1 or not out.flags.c_contiguous:
            return False
        start, column = out.ctypes.data, 0
        for x, width in zip(inputs, widths):
            if (
                not x.flags.c_contiguous
                or x.dtype != out.dtype
                or x.ctypes.data != start + column * out.itemsize
            ):
                return False
            column += width
        return True

    def execute(self, inputs, outputs=None):
        arrays = [np.asarray(x, order="C") for x in inputs]
        first = arrays[0]
        shape, outer, widths = self.layout(tuple(x.shape for x in arrays))
        out = np.empty(shape, first.dtype) if outputs is None else outputs[0]
        if out.size == 0:
            return [out]
        total = out.size // outer
        flat_out, column = as_words(out), 0
        start = out.ctypes.data if outer == 1 else 0
        for x, width in zip(arrays, widths):
            if outer == 1 and x.ctypes.data == start + column * out.itemsize:
                pass  # written in place by its producer (a sub-tensor of the output)
            elif width:
                _concat_part(as_words(x), flat_out, width, total, column, self.bounds(x.size))
            column += width
        return [out]
