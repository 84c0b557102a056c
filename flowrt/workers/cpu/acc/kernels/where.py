"""Where: a bool condition picking from X or Y, all three broadcast like numpy; X and Y of any
one data type of 1, 2, 4 or 8 bytes (a pick moves bits, it computes nothing).

The output is walked as rows (``strided.collapse`` over the three operands). A GPT causal
mask, a ``(1, 1, S, S)`` condition against ``(B, H, S, S)`` scores and a scalar fill,
collapses to ``B*H`` rows of ``S*S`` elements: the condition restarts each row, the scores
run on, the fill repeats.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from flowrt.engine.graph.shapes import broadcast_shapes
from flowrt.errors import BackendError
from flowrt.registry import Support, WorkloadInfo
from flowrt.types import DataType, static_dims
from flowrt.workers.cpu.acc.calls import NATIVE, SliceFunction
from flowrt.workers.cpu.acc.kernels import acc_kernel
from flowrt.workers.cpu.acc.kernels.strided import (
    as_index,
    as_words,
    broadcast_strides,
    collapse,
    cut_flat,
    has_word_size,
    row_bounds,
    row_offset,
)


@njit(inline="always", nogil=True, cache=True)
def _select_row(c, x, y, d):
    """``d = where(c, x, y)`` along one row; an operand of one element repeats.

    Each case is its own loop over slices from index 0, and loads both operands before it
    picks: numba then drops its negative-index checks and LLVM turns the pick into a
    vector select (with a branch per element, a random mask runs sixty times slower)."""
    n = d.shape[0]
    if c.shape[0] < n:  # one condition for the whole row: a copy or a fill
        src = x if c[0] else y
        if src.shape[0] < n:
            v = src[0]
            for j in range(n):
                d[j] = v
        else:
            for j in range(n):
                d[j] = src[j]
    elif x.shape[0] == n and y.shape[0] == n:
        for j in range(n):
            a, b = x[j], y[j]
            d[j] = a if c[j] else b
    elif x.shape[0] == n:  # a mask's fill value
        b = y[0]
        for j in range(n):
            a = x[j]
            d[j] = a if c[j] else b
    elif y.shape[0] == n:
        a = x[0]
        for j in range(n):
            b = y[j]
            d[j] = a if c[j] else b
    else:
        a, b = x[0], y[0]
        for j in range(n):
            d[j] = a if c[j] else b


@njit(nogil=True, cache=True)
def _select_rows(c, c_strides, x, x_strides, y, y_strides, steps, out, outer, inner, first, last):
    """Output rows ``first`` to ``last`` (the last row of ``out`` may be shorter); along a row
    the condition, X and Y step ``steps[0]``, ``steps[1]`` and ``steps[2]`` (1, or 0 where
    one element repeats)."""
    size = out.shape[0]
    for r in range(first, last):
        lo = r * inner
        n = min(inner, size - lo)
        ci = row_offset(r, outer, c_strides)
        xi = row_offset(r, outer, x_strides)
        yi = row_offset(r, outer, y_strides)
        _select_row(
            c[ci : ci + (n if steps[0] else 1)],
            x[xi : xi + (n if steps[1] else 1)],
            y[yi : yi + (n if steps[2] else 1)],
            out[lo : lo + n],
        )


@njit(**NATIVE)
def _select_slice(s, _step, bounds, c, c_strides, x, x_strides, y, y_strides, steps, out, outer, inner):
    """Slice ``s`` of :data:`_SELECT` (a ``SliceFunction``)."""
    _select_rows(c, c_strides, x, x_strides, y, y_strides, steps, out, outer, inner, bounds[s], bounds[s + 1])


_SELECT = SliceFunction(_select_slice)


def _select(c, c_strides, x, x_strides, y, y_strides, steps, out, outer, inner, bounds):
    """Every slice of ``bounds``, spread over the workers."""
    args = (bounds, c, c_strides, x, x_strides, y, y_strides, steps, out, outer, inner)
    _SELECT.run(bounds.shape[0] - 1, args)


class SelectWalk:
    """How the condition, X and Y broadcast to the output are walked: rows of ``inner``
    elements over an ``outer`` grid (equal shapes: flat rows, the last one shorter)."""

    def __init__(self, shapes: list[tuple[int, ...]], workers: int) -> None:
        self.shape = static_dims(broadcast_shapes(*shapes, where="Where"))  # of known shapes
        dims, strides = cut_flat(*collapse(self.shape, *(broadcast_strides(s, self.shape) for s in shapes)))
        self.inner, self.outer = dims[-1], as_index(dims[:-1])
        self.strides = [as_index(s[:-1]) for s in strides]
        self.steps = as_index([s[-1] for s in strides])
        self.rows = int(np.prod(dims[:-1], dtype=np.int64))
        self.bounds = row_bounds(self.rows, self.inner, workers)

    def run(self, c: np.ndarray, x: np.ndarray, y: np.ndarray, out: np.ndarray) -> None:
        """``out = where(c, x, y)``: all flat, ``x``, ``y`` and ``out`` as words."""
        (cs, xs, ys), walk = self.strides, (self.steps, out, self.outer, self.inner)
        if self.bounds.shape[0] > 2:
            _select(c, cs, x, xs, y, ys, *walk, self.bounds)
        else:
            _select_rows(c, cs, x, xs, y, ys, *walk, 0, self.rows)


@acc_kernel("Where")
class WhereKernel:
    """Where over broadcast operands, split into row slices across the CPU workers."""

    @classmethod
    def supports(cls, info: WorkloadInfo) -> Support:
        present = [i for i in info.inputs if i is not None]
        if len(info.inputs) != 3 or len(present) != 3:
            return Support.no("CpuAcc Where takes three present inputs only")
        condition, x, y = present
        if condition.dtype is not DataType.BOOL:
            return Support.no("CpuAcc Where takes a bool condition only")
        if x.dtype is not y.dtype or not has_word_size(x.dtype.numpy):
            return Support.no("CpuAcc Where takes X and Y of one data type of 1, 2, 4 or 8 bytes only")
        return Support.yes()

    def __init__(self, info: WorkloadInfo, workers: int) -> None:
        if info.activation is not None:
            raise BackendError(f"CpuAcc Where {info.layer_name!r} cannot apply a fused activation")
        self.info = info
        self.workers = workers
        self._walks: dict[tuple[tuple[int, ...], ...], SelectWalk] = {}

    def walk(self, shapes: tuple[tuple[int, ...], ...]) -> SelectWalk:
        """The walk for the three input shapes (planned once per shapes)."""
        cached = self._walks.get(shapes)
        if cached is None:
            cached = self._walks[shapes] = SelectWalk(list(shapes), self.workers)
        return cached

    def execute(self, inputs, outputs=None):
        c, x, y = (np.asarray(a, order="C") for a in inputs)
        walk = self.walk((c.shape, x.shape, y.shape))
        out = np.empty(walk.shape, x.dtype) if outputs is None else outputs[0]
        if out.size:
            walk.run(as_words(c), as_words(x), as_words(y), as_words(out))
        return [out]
