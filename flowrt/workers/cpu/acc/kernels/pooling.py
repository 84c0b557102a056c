"""2-D pooling over (N*C) planes: MaxPool and AveragePool (the global pools: ``global_pooling.py``).

The window is the N*C planes of the input; each slice is a run of whole planes. For the
windowed kinds, the geometry (pads, ceil mode, auto_pad) is resolved once per input shape
into per-axis tables: where each output row/column's window starts and which of its kernel
cells fall inside the input, so the jitted loop never tests a cell against the borders.

A pool whose outputs cover most of the plane (the 3x3 pools of the light models, stride 1
or 2, and 2x2 stride-2 ones) instead runs on stacked (phase) planes: ``stacked_pooling.py``,
but for a strided MaxPool, which runs row by row (``row_max_pool.py``); a pool of 2x2 windows
at stride 2 that tile the plane, in one loop per output row.
"""

from __future__ import annotations

import attrs
import numpy as np
from numba import njit

from flowrt.engine.graph.layers.pooling import pool_geometry
from flowrt.engine.scheduler.window import SplitHint
from flowrt.registry import Support, WorkloadInfo
from flowrt.types import DataType
from flowrt.workers.cpu.acc.calls import NATIVE, SliceFunction
from flowrt.workers.cpu.acc.kernels import acc_kernel, float32_data
from flowrt.workers.cpu.acc.kernels.global_pooling import global_average_pool, global_max_pool, plane_bounds
from flowrt.workers.cpu.acc.kernels.row_max_pool import MAX_PLANES, along_address
from flowrt.workers.cpu.acc.kernels.stacked_pooling import FLAT_FLOATS, pool_flat


@attrs.frozen(eq=False)
class AxisTable:
    """One spatial axis of a windowed pool, resolved for one input size.

    By output position: ``start``, the input index of its window's first cell (negative in the
    leading pad); ``[lo, hi)``, the kernel cells that fall inside the input; ``count``, the
    cells AveragePool divides by. By kernel cell: ``[first, last)``, the output positions
    whose window has that cell inside the input.
    """

    start: np.ndarray
    lo: np.ndarray
    hi: np.ndarray
    count: np.ndarray
    first: np.ndarray
    last: np.ndarray
    stride: int
    dilation: int
    begin: int


def _ceil_div(a: np.ndarray, b: int) -> np.ndarray:
    return -(-a // b)


def axis_table(desc, size: int, axis: int, geometry) -> AxisTable:
    """The table of spatial ``axis`` (``size`` input cells) under the resolved ``geometry``."""
    kernel, stride, dilation = desc.kernel_shape[axis], geometry.strides[axis], geometry.dilations[axis]
    begin, end, out = geometry.pads_begin[axis], geometry.pads_end[axis], geometry.out[axis]
    start = np.arange(out, dtype=np.int64) * stride - begin
    # Cell k of output o reads input start[o] + k * dilation, inside when in [0, size).
    lo = np.clip(_ceil_div(-start, dilation), 0, kernel)
    hi = np.maximum(np.clip(_ceil_div(size - start, dilation), 0, kernel), lo)
    offset = np.arange(kernel, dtype=np.int64) * dilation - begin
    first = np.clip(_ceil_div(-offset, stride), 0, out)
    last = np.maximum(np.clip(_ceil_div(size - offset, stride), 0, out), first)
    cells = start[:, None] + np.arange(kernel) * dilation
    # Pad cells count with count_include_pad; cells ceil mode reaches past the end pad never do.
    low, high = (-begin, size + end) if getattr(desc, "count_include_pad", 0) else (0, size)
    count = ((cells >= low) & (cells < high)).sum(axis=1)
    # A window with no counted cell (only in ceil mode) has no mean; its sum is 0 anyway.
    count = np.maximum(count, 1).astype(np.int64)
    return AxisTable(start, lo, hi, count, first, last, stride, dilation, begin)


@attrs.frozen(eq=False)
class PoolPlan:
    """A windowed pool resolved for one input shape."""

    out_shape: tuple[int, ...]
    bounds: np.ndarray
    height: AxisTable
    width: AxisTable
    # Planes mostly covered by outputs: run by pool_flat, ``group`` planes at a time; ``taps``
    # is (kh, kw, dh, dw, pad top, pad left, sh, sw, rows, pitch), the last two those of each
    # phase plane.
    flat: bool = False
    taps: np.ndarray | None = None
    group: int = 1
    # One window covering the whole unpadded plane: run as the global pool.
    whole: bool = False
    # 2x2 windows at stride 2 that tile the unpadded plane (DenseNet's transitions, UNet's
    # pools): run by _average_halves or _max_halves.
    halving: bool = False
    # The axis tables _flat_group takes (for the exact MaxPool), and 1 / count per output cell.
    table: tuple = attrs.field(init=False)

    @table.default
    def _table(self) -> tuple:
        h, w = self.height, self.width
        reciprocal = 1.0 / (h.count[:, None] * w.count[None, :])
        return (h.start, h.lo, h.hi, h.count, w.first, w.last, w.count, w.stride, w.begin, reciprocal)


@njit(inline="always", nogil=True, cache=True)
def _add_along(row, line, first, last, sw, offset):
    """``row[o] += line[o * sw + offset]`` for ``o`` in ``[first, last)``; strides 1 and 2
    spelled out so that LLVM vectorizes them."""
    if last <= first:
        return
    dst = row[first:last]
    src = line[first * sw + offset :]
    if sw == 1:
        for o in range(dst.shape[0]):
            dst[o] += src[o]
    elif sw == 2:
        for o in range(dst.shape[0]):
            dst[o] += src[2 * o]
    else:
        for o in range(dst.shape[0]):
            dst[o] += src[o * sw]


@njit(**NATIVE)
def _average_halves(task, step, x, out, bounds):
    """Slice ``task`` of planes (a :class:`SliceFunction`): the mean of each 2x2 cell block,
    added in CpuRef's row-major order; the stride-2 reads of one loop over the output row
    are an interleaved group that LLVM vectorizes: 4-7x the stacked path on DenseNet's
    transitions. Times 0.25 is CpuRef's division by 4: exact."""
    quarter = np.float32(0.25)
    for p in range(bounds[task], bounds[task + 1]):
        for oh in range(out.shape[1]):
            top, bottom, row = x[p, 2 * oh], x[p, 2 * oh + 1], out[p, oh]
            for ow in range(row.shape[0]):
                c = 2 * ow
                row[ow] = (((top[c] + top[c + 1]) + bottom[c]) + bottom[c + 1]) * quarter


@njit(**NATIVE)
def _average_pool(task, step, x, out, bounds, hs, hlo, hhi, hcount, dh, wfirst, wlast, wcount, sw, dw, pw):
    """Slice ``task`` of planes (a :class:`SliceFunction`) of any other AveragePool."""
    for p in range(bounds[task], bounds[task + 1]):
        for oh in range(out.shape[1]):
            # Row by row, kernel cell by kernel cell: each output still adds its cells in
            # CpuRef's row-major kernel order.
            row = out[p, oh]
            row[:] = 0
            for kh in range(hlo[oh], hhi[oh]):
                line = x[p, hs[oh] + kh * dh]
                for kw in range(wfirst.shape[0]):
                    _add_along(row, line, wfirst[kw], wlast[kw], sw, kw * dw - pw)
            for ow in range(row.shape[0]):
                # Divided in float64, as CpuRef divides its float32 sums by int64 counts.
                row[ow] = np.float64(row[ow]) / (hcount[oh] * wcount[ow])


@njit(inline="always", nogil=True, cache=True)
def _max_nan(a, b):
    """The larger of ``a`` and ``b``, NaN if either is (as CpuRef's max): one compare, one
    test and a select, which vectorize."""
    return a if (a >= b) | (a != a) else b


@njit(**NATIVE)
def _max_halves(task, step, x, out, bounds):
    """Slice ``task`` of planes (a :class:`SliceFunction`): the max of each 2x2 cell block, one
    vectorized loop per output row as :func:`_average_halves` (UNet's pools: 2.5x the row
    path on 32x32 planes)."""
    for p in range(bounds[task], bounds[task + 1]):
        for oh in range(out.shape[1]):
            top, bottom, row = x[p, 2 * oh], x[p, 2 * oh + 1], out[p, oh]
            for ow in range(row.shape[0]):
                c = 2 * ow
                row[ow] = _max_nan(_max_nan(top[c], top[c + 1]), _max_nan(bottom[c], bottom[c + 1]))


_AVERAGE_HALVES = SliceFunction(_average_halves)
_MAX_HALVES = SliceFunction(_max_halves)
_AVERAGE_POOL = SliceFunction(_average_pool)


class _WindowedPool:
    """What MaxPool and AveragePool share: the support check and a plan per input shape."""

    split_hint = SplitHint(axis=0, min_slice=1)
    # Whether strided pools take the stacked path too (else only stride 1 does).
    strided_flat = True

    @classmethod
    def supports(cls, info: WorkloadInfo) -> Support:
        if len(info.descriptor.kernel_shape) != 2:
            return Support.no(f"CpuAcc {info.kind} takes 2-D pooling (N, C, H, W) only")
        return float32_data(info)

    def __init__(self, info: WorkloadInfo, workers: int) -> None:
        self.info = info
        self.workers = workers
        self._plans: dict[tuple[int, ...], PoolPlan] = {}

    def plan(self, shape: tuple[int, ...]) -> PoolPlan:
        """The plan for an input of ``shape`` (computed once per shape)."""
        cached = self._plans.get(shape)
        if cached is None:
            desc = self.info.descriptor
            geometry = pool_geometry(desc, shape[2:])
            reads = int(np.prod(geometry.out)) * int(np.prod(desc.kernel_shape))
            (kh, kw), (dh, dw) = desc.kernel_shape, geometry.dilations
            (oh, ow), (bh, bw), (sh, sw) = geometry.out, geometry.pads_begin, geometry.strides
            rows, pitch = oh + (kh - 1) * dh // sh, ow + (kw - 1) * dw // sw
            unpadded = not any(geometry.pads_begin) and not any(geometry.pads_end)
            whole = unpadded and (oh, ow) == (1, 1) and (kh, kw) == shape[2:] and (dh, dw) == (1, 1)
            strided = (sh, sw) != (1, 1)
            halving = (
                unpadded
                and (kh, kw) == (sh, sw) == (2, 2)
                and (dh, dw) == (1, 1)
                and (oh, ow) == (shape[2] // 2, shape[3] // 2)
            )
            cached = self._plans[shape] = PoolPlan(
                (*shape[:2], *geometry.out),
                plane_bounds(shape[0] * shape[1], reads, self.workers),
                axis_table(desc, shape[2], 0, geometry),
                axis_table(desc, shape[3], 1, geometry),
                flat=2 * oh * ow >= rows * pitch > 0 and (self.strided_flat or not strided),
                taps=np.array([kh, kw, dh, dw, bh, bw, sh, sw, rows, pitch], np.int64),
                group=max(1, FLAT_FLOATS // max(1, sh * sw * rows * pitch)),
                whole=whole,
                halving=halving,
            )
        return cached

    def planes(self, inputs, outputs):
        """``(plan, input planes, output, output planes)``: the arrays as (N*C, H, W) views."""
        x = np.ascontiguousarray(inputs[0])
        plan = self.plan(x.shape)
        out = np.empty(plan.out_shape, x.dtype) if outputs is None else outputs[0]
        n_planes = x.shape[0] * x.shape[1]
        return plan, x.reshape(n_planes, *x.shape[2:]), out, out.reshape(n_planes, *plan.out_shape[2:])


@njit(**NATIVE)
def _max_planes_int(s, _step, bounds, x, out, hs, hlo, hhi, dh, kw_count, sw, dw, pw, lowest):
    """MaxPool of 8-bit integers (a quantized model's, ``fold_qdq``), slice ``s`` of planes
    (``x`` (P, H, W), ``out`` (P, OH, OW)), as ``row_max_pool`` does float32: per output row,
    the max over its kernel rows inside the input into a row buffer with ``pw`` cells of
    ``lowest`` before it and enough after it for every window, then the max along the row,
    each window's cells at the stride. Compares and selects on unsigned flat offsets, which
    vectorize; windows that reach no input cell hold ``lowest``."""
    height, width = x.shape[1], x.shape[2]
    oh_count, ow_count = out.shape[1], out.shape[2]
    xf, of = x.reshape(-1), out.reshape(-1)
    span = max(pw + width, (ow_count - 1) * sw + (kw_count - 1) * dw + 1)
    row = np.empty(span, x.dtype)
    for i in range(span):
        row[i] = lowest
    u8, at = np.uint64, np.uint64(pw)
    for p in range(bounds[s], bounds[s + 1]):
        for oh in range(oh_count):
            target = u8((p * oh_count + oh) * ow_count)
            if hhi[oh] == hlo[oh]:  # no kernel row inside the input
                for o in range(u8(ow_count)):
                    of[target + o] = lowest
                continue
            first = u8((p * height + hs[oh] + hlo[oh] * dh) * width)
            for i in range(u8(width)):
                row[at + i] = xf[first + i]
            for kh in range(hlo[oh] + 1, hhi[oh]):
                line = u8((p * height + hs[oh] + kh * dh) * width)
                for i in range(u8(width)):
                    v = xf[line + i]
                    row[at + i] = v if v > row[at + i] else row[at + i]
            if kw_count == 3 and sw == 2 and dw == 1:  # a stem's pool: constant strides vectorize
                for o in range(u8(ow_count)):
                    a, b, c = row[2 * o], row[2 * o + 1], row[2 * o + 2]
                    best = a if a > b else b
                    of[target + o] = c if c > best else best
                continue
            if kw_count == 3:  # the classic window: its three cells in one pass
                d1, d2 = u8(dw), u8(2 * dw)
                for o in range(u8(ow_count)):
                    q = o * u8(sw)
                    a, b, c = row[q], row[q + d1], row[q + d2]
                    best = a if a > b else b
                    of[target + o] = c if c > best else best
                continue
            for o in range(u8(ow_count)):
                q = o * u8(sw)
                best = row[q]
                for k in range(1, kw_count):
                    v = row[q + u8(k * dw)]
                    best = v if v > best else best
                of[target + o] = best


_MAX_PLANES_INT = SliceFunction(_max_planes_int)
# The 8-bit types MaxPool takes besides float32, and the lowest value of each (an empty window's).
_INT8_LOWEST = {DataType.UINT8: 0, DataType.INT8: -128}


@acc_kernel("MaxPool")
class MaxPoolKernel(_WindowedPool):
    """The largest value of each window (padding never wins), planes split across workers;
    on float32, or on the 8-bit values of a quantized model (``_max_planes_int``)."""

    # A strided max runs faster row by row: the max over the kernel rows, then along them.
    strided_flat = False

    @classmethod
    def supports(cls, info: WorkloadInfo) -> Support:
        if info.descriptor.num_outputs != 1:
            return Support.no("CpuAcc MaxPool computes Y only, not the Indices output")
        x = info.inputs[0] if info.inputs else None
        if x is not None and x.dtype in _INT8_LOWEST and len(info.descriptor.kernel_shape) == 2:
            return Support.yes()
        return super().supports(info)

    def execute(self, inputs, outputs=None):
        plan, x, out, y = self.planes(inputs, outputs)
        if x.dtype != np.float32:
            h, w = plan.height, plan.width
            lowest = x.dtype.type(_INT8_LOWEST[DataType.from_numpy(x.dtype)])
            args = (plan.bounds, x, y, h.start, h.lo, h.hi, h.dilation, w.first.shape[0], w.stride)
            _MAX_PLANES_INT.run(plan.bounds.shape[0] - 1, (*args, w.dilation, w.begin, lowest))
            return [out]
        if plan.whole:
            global_max_pool(x.reshape(x.shape[0], -1), y.reshape(-1), plan.bounds)
        elif plan.halving:
            _MAX_HALVES.run(plan.bounds.shape[0] - 1, (x, y, plan.bounds))
        elif plan.flat:
            pool_flat(x, y, plan.bounds, plan.taps, plan.group, True, plan.table)
        else:
            h, w = plan.height, plan.width
            args = (
                plan.bounds,
                x,
                y,
                h.start,
                h.lo,
                h.hi,
                h.dilation,
                w.first,
                w.last,
                w.stride,
                w.dilation,
                w.begin,
                along_address(w.stride),
            )
            MAX_PLANES.run(plan.bounds.shape[0] - 1, args)
        return [out]


@acc_kernel("AveragePool")
class AveragePoolKernel(_WindowedPool):
    """The mean of each window; pad cells count towards it only with ``count_include_pad``."""

    def execute(self, inputs, outputs=None):
        plan, x, out, y = self.planes(inputs, outputs)
        if plan.whole:
            global_average_pool(x.reshape(x.shape[0], -1), y.reshape(-1), plan.bounds)
        elif plan.halving:
            _AVERAGE_HALVES.run(plan.bounds.shape[0] - 1, (x, y, plan.bounds))
        elif plan.flat:
            pool_flat(x, y, plan.bounds, plan.taps, plan.group, False, plan.table)
        else:
            h, w = plan.height, plan.width
            args = (
                h.start,
                h.lo,
                h.hi,
                h.count,
                h.dilation,
                w.first,
                w.last,
                w.count,
                w.stride,
                w.dilation,
                w.begin,
            )
            _AVERAGE_POOL.run(plan.bounds.shape[0] - 1, (x, y, plan.bounds, *args))
        return [out]
