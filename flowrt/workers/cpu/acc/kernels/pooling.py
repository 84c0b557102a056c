"""2-D pooling over (N*C) planes: MaxPool and AveragePool (the global pools: ``global_pooling.py``).

The window is the N*C planes of the input; each slice is a run of whole planes. For the
windowed kinds, the geometry (pads, ceil mode, auto_pad) is resolved once per input shape
into per-axis tables: where each output row/column's window starts and which of its kernel
cells fall inside the input, so the jitted loop never tests a cell against the borders.

A pool whose outputs cover most of the plane (the 3x3 pools of the light models, stride 1
or 2, and 2x2 stride-2 ones) instead copies a group of planes at a time into padded planes
stacked in one buffer (pad cells 0, or -inf for max), split into phase planes when strided
(the cells whose row and column are i and j modulo the strides), and makes each kernel cell
one long pass over all of them: row by row, the 7 to 28 wide rows of those layers are too
short for the vectorized loops to pay off, and strided reads do not vectorize.
"""

from __future__ import annotations

import attrs
import numpy as np
from numba import njit, prange

from flowrt.engine.graph.layers.pooling import pool_geometry
from flowrt.engine.scheduler.window import SplitHint
from flowrt.registry import Support, WorkloadInfo
from flowrt.workers.cpu.acc.kernels import acc_kernel, float32_data
from flowrt.workers.cpu.acc.kernels.global_pooling import global_average_pool, global_max_pool, plane_bounds


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
    # Planes mostly covered by outputs: run by _pool_flat, ``group`` planes at a time; ``taps``
    # is (kh, kw, dh, dw, pad top, pad left, sh, sw, rows, pitch), the last two those of each
    # phase plane.
    flat: bool = False
    taps: np.ndarray | None = None
    group: int = 1
    # One window covering the whole unpadded plane: run as the global pool.
    whole: bool = False
    # The axis tables _flat_group takes (for the exact MaxPool), and 1 / count per output cell.
    table: tuple = attrs.field(init=False)

    @table.default
    def _table(self) -> tuple:
        h, w = self.height, self.width
        reciprocal = 1.0 / (h.count[:, None] * w.count[None, :])
        return (h.start, h.lo, h.hi, h.count, w.first, w.last, w.count, w.stride, w.begin, reciprocal)


# Indices are cast to uint64 in the hot loops: numba wraps negative signed indices around,
# and that check keeps LLVM from vectorizing.


@njit(nogil=True, cache=True)
def _max_plane_exact(x, out, hs, hlo, hhi, dh, wfirst, wlast, sw, dw, pw, column):
    """One plane of MaxPool with np.maximum, which lets NaN win as CpuRef's does (slower:
    its NaN test keeps LLVM from vectorizing). Max is separable: first over the kernel rows,
    then along the row."""
    lowest = np.float32(-np.inf)
    for oh in range(out.shape[0]):
        row = out[oh]
        row[:] = lowest
        if hhi[oh] == hlo[oh]:
            continue
        column[:] = x[hs[oh] + hlo[oh] * dh]
        for kh in range(hlo[oh] + 1, hhi[oh]):
            line = x[hs[oh] + kh * dh]
            for i in range(column.shape[0]):
                iw = np.uint64(i)
                column[iw] = np.maximum(column[iw], line[iw])
        for kw in range(wfirst.shape[0]):
            offset = kw * dw - pw
            for ow in range(wfirst[kw], wlast[kw]):
                o = np.uint64(ow)
                row[o] = np.maximum(row[o], column[np.uint64(ow * sw + offset)])


@njit(inline="always", nogil=True, cache=True)
def _max_along(row, column, kw_count, sw, dw):
    """``row[o]`` = the max of ``column[o * sw + k * dw]`` over the kernel cells ``k``: one pass
    per cell, the common strides spelled out so that LLVM vectorizes them."""
    count = row.shape[0]
    if sw == 1:
        for o in range(count):
            row[o] = column[o]
        for k in range(1, kw_count):
            shifted = column[k * dw : k * dw + count]
            for o in range(count):
                row[o] = max(row[o], shifted[o])
    elif sw == 2 and kw_count == 3 and dw == 1:  # the classic 3x3 stride-2 pool, in one pass
        for o in range(count):
            row[o] = max(max(column[2 * o], column[2 * o + 1]), column[2 * o + 2])
    elif sw == 2 and kw_count == 2 and dw == 1:
        for o in range(count):
            row[o] = max(column[2 * o], column[2 * o + 1])
    elif sw == 2:
        for o in range(count):
            row[o] = column[2 * o]
        for k in range(1, kw_count):
            shifted = column[k * dw :]
            for o in range(count):
                row[o] = max(row[o], shifted[2 * o])
    else:
        for o in range(count):
            row[o] = column[o * sw]
        for k in range(1, kw_count):
            shifted = column[k * dw :]
            for o in range(count):
                row[o] = max(row[o], shifted[o * sw])


@njit(parallel=True, nogil=True, cache=True)
def _max_pool(x, out, bounds, hs, hlo, hhi, dh, wfirst, wlast, sw, dw, pw):
    """Each plane with plain ``max`` (vectorized; it lets NaN lose), noting NaN in the input
    it reads: a plane that has one is computed again by :func:`_max_plane_exact`.

    The kernel rows' max goes into a column buffer with ``pw`` cells of -inf before the
    row and enough after it for every window: padding never wins, and no window needs a
    bounds test."""
    width, kw_count = x.shape[2], wfirst.shape[0]
    lowest = np.float32(-np.inf)
    span = max(pw + width, (out.shape[2] - 1) * sw + (kw_count - 1) * dw + 1)
    for s in prange(bounds.shape[0] - 1):
        padded = np.full(span, lowest, np.float32)
        column = padded[pw : pw + width]
        exact = np.empty(width, np.float32)
        for p in range(bounds[s], bounds[s + 1]):
            nan = False
            for oh in range(out.shape[1]):
                row = out[p, oh]
                if hhi[oh] == hlo[oh]:
                    row[:] = lowest
                    continue
                line = x[p, hs[oh] + hlo[oh] * dh]
                for i in range(width):
                    v = line[i]
                    column[i] = v
                    nan |= v != v
                for kh in range(hlo[oh] + 1, hhi[oh]):
                    line = x[p, hs[oh] + kh * dh]
                    for i in range(width):
                        v = line[i]
                        column[i] = max(column[i], v)
                        nan |= v != v
                _max_along(row, padded, kw_count, sw, dw)
            if nan:
                _max_plane_exact(x[p], out[p], hs, hlo, hhi, dh, wfirst, wlast, sw, dw, pw, exact)


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


@njit(parallel=True, nogil=True, cache=True)
def _average_pool(x, out, bounds, hs, hlo, hhi, hcount, dh, wfirst, wlast, wcount, sw, dw, pw):
    for s in prange(bounds.shape[0] - 1):
        for p in range(bounds[s], bounds[s + 1]):
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


# The (phase) planes a stacked pool copies its input planes into are kept near this many floats.
FLAT_FLOATS = 8192


@njit(inline="always", nogil=True, cache=True)
def _copy(dst, src):
    for f in range(dst.shape[0]):
        k = np.uint64(f)
        dst[k] = src[k]


@njit(inline="always", nogil=True, cache=True)
def _max_into(dst, src):
    for f in range(dst.shape[0]):
        k = np.uint64(f)
        dst[k] = max(dst[k], src[k])


@njit(inline="always", nogil=True, cache=True)
def _add_into(dst, src):
    for f in range(dst.shape[0]):
        k = np.uint64(f)
        dst[k] += src[k]


@njit(inline="always", nogil=True, cache=True)
def _fill_phases(buf, x, g, group, rows, pitch, sh, sw, bh, bw):
    """Input plane ``x`` into plane ``g`` of the stack ``buf``: phase plane (i, j) holds the
    padded plane's cells whose row and column are i and j modulo the strides, and the phases
    are stacked outermost (phase, plane, row, column). Only cells that come from ``x`` are
    written: the pad cells are the same for every plane."""
    height, width = x.shape
    for i in range(sh):
        r_lo = min(rows, max(0, -(-(bh - i) // sh)))
        r_hi = min(rows, max(r_lo, -(-(height + bh - i) // sh)))
        for j in range(sw):
            base = (((i * sw + j) * group) + g) * rows * pitch
            c_lo = min(pitch, max(0, -(-(bw - j) // sw)))
            c_hi = min(pitch, max(c_lo, -(-(width + bw - j) // sw)))
            first = j + c_lo * sw - bw
            for r in range(r_lo, r_hi):
                line = x[i + r * sh - bh, first:]
                dst = buf[base + r * pitch + c_lo : base + r * pitch + c_hi]
                if sw == 1:
                    _copy(dst, line)
                else:
                    for c in range(dst.shape[0]):
                        dst[np.uint64(c)] = line[np.uint64(c * sw)]


@njit(nogil=True, cache=True)
def _flat_group(x, out, p0, planes, group, buf, acc, column, taps, is_max, table):
    """Planes ``p0 .. p0 + planes`` of a pool on stacked phase planes ``buf`` (``group`` planes
    of ``rows`` x ``pitch`` per phase; their pad cells hold the pad value: 0, or -inf for max):
    each kernel cell reads one phase from a fixed offset, so it is one pass over all planes."""
    kh, kw, dh, dw, bh, bw = taps[0], taps[1], taps[2], taps[3], taps[4], taps[5]
    sh, sw, rows, pitch = taps[6], taps[7], taps[8], taps[9]
    oh_count, ow_count = out.shape[1], out.shape[2]
    for g in range(planes):
        _fill_phases(buf, x[p0 + g], g, group, rows, pitch, sh, sw, bh, bw)
    nan = False
    if is_max:
        # Counted over the whole buffer in one pass, which vectorizes (pad cells are -inf).
        count = 0
        for f in range(buf.shape[0]):
            v = buf[np.uint64(f)]
            count += v != v
        nan = count > 0
    stack = group * rows * pitch
    span = stack - ((kh - 1) * dh // sh) * pitch - (kw - 1) * dw // sw
    res = acc[:span]
    if is_max and sh == 1 and sw == 1:
        # Max is separable: over the kernel rows into the back half of ``acc``, then along
        # those into the front half.
        wide = span + (kw - 1) * dw
        col = acc[acc.shape[0] // 2 : acc.shape[0] // 2 + wide]
        _copy(col, buf)
        for i in range(1, kh):
            _max_into(col, buf[i * dh * pitch : i * dh * pitch + wide])
        _copy(res, col)
        for j in range(1, kw):
            _max_into(res, col[j * dw : j * dw + span])
    else:
        # Cell by cell in row-major kernel order, as CpuRef adds them; pad cells add 0.
        for i in range(kh):
            for j in range(kw):
                phase = ((i * dh) % sh) * sw + (j * dw) % sw
                offset = phase * stack + (i * dh // sh) * pitch + j * dw // sw
                if i == 0 and j == 0:
                    _copy(res, buf[offset : offset + span])
                elif is_max:
                    _max_into(res, buf[offset : offset + span])
                else:
                    _add_into(res, buf[offset : offset + span])
    hs, hlo, hhi, hcount, wfirst, wlast, wcount, sw_, pw, reciprocal = table
    for g in range(planes):
        p = p0 + g
        if is_max and nan:
            _max_plane_exact(x[p], out[p], hs, hlo, hhi, dh, wfirst, wlast, sw_, dw, pw, column)
            continue
        for oh in range(oh_count):
            src = acc[(g * rows + oh) * pitch :]
            row = out[p, oh]
            if is_max:
                for ow in range(ow_count):
                    k = np.uint64(ow)
                    row[k] = src[k]
            else:
                # 1 / count in float64 rounds to float32 as CpuRef's division by the count does.
                divisors = reciprocal[oh]
                for ow in range(ow_count):
                    k = np.uint64(ow)
                    row[k] = np.float64(src[k]) * divisors[k]


@njit(parallel=True, nogil=True, cache=True)
def _pool_flat(x, out, bounds, taps, group, is_max, table):
    """A MaxPool or AveragePool whose outputs cover most of their (phase) planes: each slice
    stacks ``group`` planes at a time into zero- (or -inf-) padded phase planes, so that every
    pass is one long loop over all of them instead of a short one per output row."""
    fill = np.float32(-np.inf) if is_max else np.float32(0)
    phases, rows, pitch = taps[6] * taps[7], taps[8], taps[9]
    for s in prange(bounds.shape[0] - 1):
        buf = np.full(phases * group * rows * pitch, fill, np.float32)
        acc = np.empty(2 * group * rows * pitch, np.float32)
        column = np.empty(x.shape[2], np.float32)
        for p0 in range(bounds[s], bounds[s + 1], group):
            planes = min(group, bounds[s + 1] - p0)
            _flat_group(x, out, p0, planes, group, buf, acc, column, taps, is_max, table)


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
            cached = self._plans[shape] = PoolPlan(
                (*shape[:2], *geometry.out),
                plane_bounds(shape[0] * shape[1], reads, self.workers),
                axis_table(desc, shape[2], 0, geometry),
                axis_table(desc, shape[3], 1, geometry),
                flat=2 * oh * ow >= rows * pitch > 0 and (self.strided_flat or not strided),
                taps=np.array([kh, kw, dh, dw, bh, bw, sh, sw, rows, pitch], np.int64),
                group=max(1, FLAT_FLOATS // max(1, sh * sw * rows * pitch)),
                whole=whole,
            )
        return cached

    def planes(self, inputs, outputs):
        """``(plan, input planes, output, output planes)``: the arrays as (N*C, H, W) views."""
        x = np.ascontiguousarray(inputs[0])
        plan = self.plan(x.shape)
        out = np.empty(plan.out_shape, np.float32) if outputs is None else outputs[0]
        n_planes = x.shape[0] * x.shape[1]
        return plan, x.reshape(n_planes, *x.shape[2:]), out, out.reshape(n_planes, *plan.out_shape[2:])


@acc_kernel("MaxPool")
class MaxPoolKernel(_WindowedPool):
    """The largest value of each window (padding never wins), planes split across workers."""

    # A strided max runs faster row by row: the max over the kernel rows, then along them.
    strided_flat = False

    @classmethod
    def supports(cls, info: WorkloadInfo) -> Support:
        if info.descriptor.num_outputs != 1:
            return Support.no("CpuAcc MaxPool computes Y only, not the Indices output")
        return super().supports(info)

    def execute(self, inputs, outputs=None):
        plan, x, out, y = self.planes(inputs, outputs)
        if plan.whole:
            global_max_pool(x.reshape(x.shape[0], -1), y.reshape(-1), plan.bounds)
        elif plan.flat:
            _pool_flat(x, y, plan.bounds, plan.taps, plan.group, True, plan.table)
        else:
            h, w = plan.height, plan.width
            _max_pool(
                x,
                y,
                plan.bounds,
                h.start,
                h.lo,
                h.hi,
                h.dilation,
                w.first,
                w.last,
                w.stride,
                w.dilation,
                w.begin,
            )
        return [out]


@acc_kernel("AveragePool")
class AveragePoolKernel(_WindowedPool):
    """The mean of each window; pad cells count towards it only with ``count_include_pad``."""

    def execute(self, inputs, outputs=None):
        plan, x, out, y = self.planes(inputs, outputs)
        if plan.whole:
            global_average_pool(x.reshape(x.shape[0], -1), y.reshape(-1), plan.bounds)
        elif plan.flat:
            _pool_flat(x, y, plan.bounds, plan.taps, plan.group, False, plan.table)
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
            _average_pool(x, y, plan.bounds, *args)
        return [out]
