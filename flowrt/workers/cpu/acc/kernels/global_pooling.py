"""GlobalAveragePool and GlobalMaxPool: one value per (N, C) plane, whole planes per slice.

GlobalAveragePool adds in numpy's pairwise order, bit for bit what CpuRef's ``np.mean`` does.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.extending import intrinsic

from flowrt.engine.scheduler.window import SplitHint, split_bounds
from flowrt.registry import Support, WorkloadInfo
from flowrt.workers.cpu.acc.calls import NATIVE, SliceFunction
from flowrt.workers.cpu.acc.kernels import acc_kernel, float32_data

# Below this many input reads per slice, a second thread costs more than it saves (a region
# starts on CpuAcc's team in about 1 us).
MIN_WORK = 8192


def plane_bounds(planes: int, reads_per_plane: int, workers: int) -> np.ndarray:
    """Slices of whole planes, each worth at least ``MIN_WORK`` reads."""
    return split_bounds(planes, SplitHint(0, max(1, MIN_WORK // max(1, reads_per_plane))), workers)


@intrinsic
def _lanes_sum(typingctx, a, first, blocks):
    """numpy's eight-lane sum of ``a[first : first + 8 * blocks]`` (``blocks`` >= 1): lane
    ``j`` adds every eighth value from ``a[first + j]`` on, one vector add per block of eight
    (a loop of eight scalar accumulators stays scalar), and the lanes are added
    ``((l0 + l1) + (l2 + l3)) + ((l4 + l5) + (l6 + l7))``: each lane adds in numpy's order,
    so the sum is numpy's bit for bit."""
    sig = types.float32(a, first, blocks)

    def codegen(context, builder, signature, args):
        data = context.make_array(signature.args[0])(context, builder, args[0]).data
        i64, lanes = ir.IntType(64), ir.VectorType(ir.FloatType(), 8)
        base = builder.gep(data, [args[1]])

        def block(i):
            return builder.load(builder.bitcast(builder.gep(base, [i]), lanes.as_pointer()), align=4)

        start = block(ir.Constant(i64, 0))
        entry = builder.block
        loop = builder.append_basic_block("lanes.loop")
        done = builder.append_basic_block("lanes.done")
        builder.cbranch(builder.icmp_signed(">", args[2], ir.Constant(i64, 1)), loop, done)
        builder.position_at_end(loop)
        index, sums = builder.phi(i64), builder.phi(lanes)
        added = builder.fadd(sums, block(builder.mul(index, ir.Constant(i64, 8))))
        following = builder.add(index, ir.Constant(i64, 1))
        index.add_incoming(ir.Constant(i64, 1), entry)
        index.add_incoming(following, loop)
        sums.add_incoming(start, entry)
        sums.add_incoming(added, loop)
        builder.cbranch(builder.icmp_signed("<", following, args[2]), loop, done)
        builder.position_at_end(done)
        total = builder.phi(lanes)
        total.add_incoming(start, entry)
        total.add_incoming(added, loop)
        lane = [builder.extract_element(total, ir.Constant(ir.IntType(32), j)) for j in range(8)]
        low = builder.fadd(builder.fadd(lane[0], lane[1]), builder.fadd(lane[2], lane[3]))
        high = builder.fadd(builder.fadd(lane[4], lane[5]), builder.fadd(lane[6], lane[7]))
        return builder.fadd(low, high)

    return sig, codegen


@njit(inline="always", nogil=True, cache=True)
def _block_sum(a, first, n):
    """numpy's pairwise sum of a block of at most 128 values: eight lanes, then the rest."""
    if n < 8:
        res = np.float32(0)
        for i in range(first, first + n):
            res += a[i]
        return res
    end = first + n - n % 8
    res = _lanes_sum(a, first, n // 8)
    for k in range(end, first + n):
        res += a[k]
    return res


@njit(**NATIVE)
def pairwise_sum(a, first, n, nodes, sums):
    """The float32 sum of ``a[first : first + n]`` in numpy's pairwise order.

    Bit for bit what CpuRef's ``np.mean`` adds: a plane of near-equal values (a classifier's
    last pooling) must pool to equal values, or the softmax after it amplifies one ulp.
    numpy halves the range (on a multiple of 8) down to blocks of 128; the recursion runs
    here on an explicit stack, since numba cannot call a recursive function from a parallel
    region: ``nodes`` (128, 3) int64 and ``sums`` (128,) float32 are its scratch.
    """
    # Nodes (first, n, halved) still to visit, and the sums of the ranges done; a range of
    # at most 128 values is one node (one copy of _block_sum's loops to compile, not two).
    nodes[0, 0], nodes[0, 1], nodes[0, 2] = first, n, 0
    top, done = 1, 0
    while top:
        top -= 1
        start, size, halved = nodes[top, 0], nodes[top, 1], nodes[top, 2]
        if size <= 128:
            sums[done] = _block_sum(a, start, size)
            done += 1
        elif halved:
            done -= 1
            sums[done - 1] += sums[done]
        else:
            half = size // 2
            half -= half % 8
            nodes[top, 2] = 1
            nodes[top + 1, 0], nodes[top + 1, 1], nodes[top + 1, 2] = start + half, size - half, 0
            nodes[top + 2, 0], nodes[top + 2, 1], nodes[top + 2, 2] = start, half, 0
            top += 3
    return sums[0]


@njit(**NATIVE)
def _average_planes(task, step, x, out, bounds):
    """The planes of slice ``task`` (a :class:`SliceFunction`)."""
    size = x.shape[1]
    nodes = np.empty((128, 3), np.int64)
    sums = np.empty(128, np.float32)
    for p in range(bounds[task], bounds[task + 1]):
        out[p] = pairwise_sum(x[p], 0, size, nodes, sums) / np.float32(size)


@njit(**NATIVE)
def _max_planes(task, step, x, out, bounds):
    """The planes of slice ``task`` (a :class:`SliceFunction`)."""
    for p in range(bounds[task], bounds[task + 1]):
        best = x[p, 0]
        for i in range(1, x.shape[1]):
            v = x[p, i]
            if v > best or v != v:
                best = v
        out[p] = best


_AVERAGE_PLANES = SliceFunction(_average_planes)
_MAX_PLANES = SliceFunction(_max_planes)


def global_average_pool(x: np.ndarray, out: np.ndarray, bounds: np.ndarray) -> None:
    """``out[p]`` = the mean of plane ``x[p]`` (``x`` (planes, size)), slices of planes in
    parallel (``bounds``)."""
    _AVERAGE_PLANES.run(bounds.shape[0] - 1, (x, out, bounds))


def global_max_pool(x: np.ndarray, out: np.ndarray, bounds: np.ndarray) -> None:
    """``out[p]`` = the largest value of plane ``x[p]`` (NaN if it holds one)."""
    _MAX_PLANES.run(bounds.shape[0] - 1, (x, out, bounds))


class _GlobalPool:
    """One value per (N, C) plane, any number of spatial dims, planes split across workers."""

    split_hint = SplitHint(axis=0, min_slice=1)
    reduce = staticmethod(global_average_pool)

    @classmethod
    def supports(cls, info: WorkloadInfo) -> Support:
        return float32_data(info)

    def __init__(self, info: WorkloadInfo, workers: int) -> None:
        self.info = info
        self.workers = workers
        self._bounds: dict[tuple[int, int], np.ndarray] = {}

    def execute(self, inputs, outputs=None):
        x = np.ascontiguousarray(inputs[0])
        n, c = x.shape[:2]
        out = np.empty((n, c) + (1,) * (x.ndim - 2), np.float32) if outputs is None else outputs[0]
        planes = x.reshape(n * c, -1)
        key = planes.shape
        bounds = self._bounds.get(key)
        if bounds is None:
            bounds = self._bounds[key] = plane_bounds(key[0], key[1], self.workers)
        if planes.shape[1] == 0:
            # An empty plane has no max; its mean is NaN, as numpy has it.
            out.fill(np.nan)
        else:
            self.reduce(planes, out.reshape(-1), bounds)
        return [out]


@acc_kernel("GlobalAveragePool")
class GlobalAveragePoolKernel(_GlobalPool):
    """The mean of each (N, C) plane."""

    reduce = staticmethod(global_average_pool)


@acc_kernel("GlobalMaxPool")
class GlobalMaxPoolKernel(_GlobalPool):
    """The largest value of each (N, C) plane."""

    reduce = staticmethod(global_max_pool)
