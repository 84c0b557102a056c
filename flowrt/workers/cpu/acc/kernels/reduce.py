"""ReduceSum, ReduceMean and ReduceMax over float32, axes from the attribute or the axes input.

Neighbouring dimensions that are both reduced or both kept are merged, so that the input reads
as ``(outer, reduced, inner)``: a global pooling is ``outer`` runs of contiguous values, a
reduction over channels is ``reduced`` rows added into ``inner`` accumulators. Axes that do
not merge into one reduced band are first moved last by a copy. Sums accumulate in float64.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from flowrt.engine.graph.layers.reduce import reduce_axes, reduced_shape
from flowrt.engine.graph.layers.reshape import const_ints
from flowrt.engine.scheduler.window import SplitHint, split_bounds
from flowrt.errors import BackendError
from flowrt.registry import Support, WorkloadInfo
from flowrt.workers.cpu.acc.calls import SliceFunction
from flowrt.workers.cpu.acc.kernels import acc_kernel, float32_data
from flowrt.workers.cpu.acc.kernels.row_sums import row_sum
from flowrt.workers.cpu.acc.kernels.strided import MIN_SLICE

SUM, MEAN, MAX = range(3)
OPS = {"ReduceSum": SUM, "ReduceMean": MEAN, "ReduceMax": MAX}
# Output elements (of one outer index) one task accumulates at once.
BLOCK = 1024


@njit(nogil=True, cache=True, error_model="numpy")
def _reduce_tasks(task, step, x, out, reduced, inner, op, bounds):
    """The tasks of slice ``task`` (a :class:`SliceFunction`): task ``t`` is outer index
    ``t // blocks``, a block of up to ``BLOCK`` of its ``inner`` outputs."""
    first, last = bounds[task], bounds[task + 1]
    if inner == 1:  # each output reduces one contiguous run (a global pooling)
        for o in range(first, last):
            run = x[o * reduced : (o + 1) * reduced]
            if op != MAX:
                total = row_sum(run)  # vectorized: the lanes' sums added at the end
            else:
                total = -np.inf
                for v in run:
                    if v > total or v != v:  # a NaN wins, as in np.max
                        total = v
            out[o] = np.float32(total / reduced if op == MEAN else total)
        return
    blocks = -(-inner // BLOCK)
    acc = np.empty(min(inner, BLOCK), np.float64)
    for t in range(first, last):
        o, lo = t // blocks, (t % blocks) * BLOCK
        n = min(BLOCK, inner - lo)
        a = acc[:n]
        a[:] = -np.inf if op == MAX else 0.0
        for r in range(reduced):
            start = (o * reduced + r) * inner + lo
            row = x[start : start + n]
            if op == MAX:
                for j in range(n):
                    v = row[j]
                    if v > a[j] or v != v:  # a NaN wins, as in np.max
                        a[j] = v
            else:
                for j in range(n):
                    a[j] += row[j]
        if op == MEAN:
            for j in range(n):
                a[j] /= reduced
        d = out[o * inner + lo : o * inner + lo + n]
        for j in range(n):
            d[j] = np.float32(a[j])


_REDUCE_TASKS = SliceFunction(_reduce_tasks)


class ReduceWalk:
    """One reduction of one input shape: the order to read the input in (None: as it is), and
    its ``(outer, reduced, inner)`` view."""

    def __init__(self, shape, axes, keepdims: bool, workers: int) -> None:
        self.shape = reduced_shape(shape, axes, keepdims)
        self.order = None
        # Dims of 1 go either way; the reduced ones must form one band, else they are moved last.
        band = [i for i, n in enumerate(shape) if i in axes and n != 1]
        if band and any(i not in axes and shape[i] != 1 for i in range(band[0], band[-1] + 1)):
            self.order = [i for i in range(len(shape)) if i not in axes] + list(axes)
            band = list(range(len(shape) - len(axes), len(shape)))
            shape = [shape[i] for i in self.order]
        first, end = (band[0], band[-1] + 1) if band else (len(shape), len(shape))
        self.outer = int(np.prod(shape[:first], dtype=np.int64))
        self.reduced = int(np.prod(shape[first:end], dtype=np.int64))
        self.inner = int(np.prod(shape[end:], dtype=np.int64))
        blocks = -(-self.inner // BLOCK)
        per_task = max(1, self.reduced * min(self.inner, BLOCK))
        self.bounds = split_bounds(self.outer * blocks, SplitHint(0, max(1, MIN_SLICE // per_task)), workers)


@acc_kernel(*OPS)
class ReduceKernel:
    """ReduceSum / ReduceMean / ReduceMax split into tasks across the CPU workers."""

    @classmethod
    def supports(cls, info: WorkloadInfo) -> Support:
        return float32_data(info)

    def __init__(self, info: WorkloadInfo, workers: int) -> None:
        if info.activation is not None:
            raise BackendError(f"CpuAcc {info.kind} {info.layer_name!r} cannot apply a fused activation")
        self.info = info
        self.workers = workers
        self.op = OPS[info.kind]
        self._walks: dict[tuple, ReduceWalk] = {}

    def walk(self, shape, axes_input) -> ReduceWalk:
        """The walk for an input shape and axes input (planned once per pair)."""
        given = const_ints(axes_input)
        key = (shape, None if given is None else tuple(given))
        cached = self._walks.get(key)
        if cached is None:
            desc = self.info.descriptor
            axes = reduce_axes(desc, len(shape), None if key[1] is None else list(key[1]))
            cached = self._walks[key] = ReduceWalk(shape, axes, bool(desc.keepdims), self.workers)
        return cached

    def execute(self, inputs, outputs=None):
        x = inputs[0]
        walk = self.walk(x.shape, inputs[1] if len(inputs) > 1 else None)
        x = np.asarray(x if walk.order is None else np.transpose(x, walk.order), order="C")
        out = np.empty(walk.shape, np.float32) if outputs is None else outputs[0]
        if out.size:
            args = (x.reshape(-1), out.reshape(-1), walk.reduced, walk.inner, self.op, walk.bounds)
            _REDUCE_TASKS.run(walk.bounds.shape[0] - 1, args)
        return [out]
