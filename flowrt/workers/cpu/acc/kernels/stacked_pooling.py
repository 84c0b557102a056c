"""MaxPool and AveragePool on stacked planes, and the exact MaxPool of one plane.

A pool whose outputs cover most of the plane (the 3x3 pools of the light models, stride 1
or 2, and 2x2 stride-2 ones) copies a group of planes at a time into padded planes stacked in
one buffer (pad cells 0, or -inf for max), split into phase planes when strided (the cells
whose row and column are i and j modulo the strides), and makes each kernel cell one long
pass over all of them: row by row, the 7 to 28 wide rows of those layers are too short for
the vectorized loops to pay off.
``flowrt.workers.cpu.acc.kernels.pooling`` plans which pools run here.
"""

from __future__ import annotations

import numpy as np
from numba import njit, types

from flowrt.workers.cpu.acc.calls import NATIVE, LateFunction, SliceFunction, call_late
from flowrt.workers.cpu.acc.phases import cell_offset, copy_run, fill_phase_planes_late

# Indices are cast to uint64 in the hot loops: numba wraps negative signed indices around,
# and that check keeps LLVM from vectorizing.


@njit(**NATIVE)
def max_plane_exact(x, out, hs, hlo, hhi, dh, wfirst, wlast, sw, dw, pw, column):
    """One plane of MaxPool with np.maximum, which lets NaN win as CpuRef's does (slower:
    its NaN test keeps LLVM from vectorizing). Max is separable: first over the kernel rows,
    then along the row."""
    lowest = np.float32(-np.inf)
    for oh in range(out.shape[0]):
        row = out[oh]
        row[:] = lowest
        if hhi[oh] == hlo[oh]:
            continue
        # A loop, not column[:] = x[...]: a slice assignment compiles numba's formatted
        # messages for shapes that do not broadcast (seconds on a cold cache).
        first = x[hs[oh] + hlo[oh] * dh]
        for i in range(column.shape[0]):
            column[i] = first[i]
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


# MaxPool's exact plane is only for inputs that hold a NaN: the kernels reach it through a slot
# (``calls.LateFunction``), compiled on the first such plane, not with them.
MAX_PLANE_EXACT_NAME = "flowrt_max_plane_exact"
_PLANE, _TABLE = types.Array(types.float32, 2, "C"), types.Array(types.int64, 1, "C")
MAX_PLANE_EXACT = LateFunction(
    max_plane_exact,
    (_PLANE, _PLANE, _TABLE, _TABLE, _TABLE, types.int64, _TABLE, _TABLE, types.int64, types.int64,
     types.int64, types.Array(types.float32, 1, "C")),
    MAX_PLANE_EXACT_NAME,
)  # fmt: skip


@njit(inline="always", nogil=True, cache=True)
def max_plane_late(x, out, hs, hlo, hhi, dh, wfirst, wlast, sw, dw, pw, column):
    """:func:`max_plane_exact` through its slot (``MAX_PLANE_EXACT``), compiled on first use."""
    args = (
        x,
        out,
        hs,
        hlo,
        hhi,
        np.int64(dh),
        wfirst,
        wlast,
        np.int64(sw),
        np.int64(dw),
        np.int64(pw),
        column,
    )
    call_late(MAX_PLANE_EXACT_NAME, args)


# The (phase) planes a stacked pool copies its input planes into are kept near this many floats.
FLAT_FLOATS = 8192


@njit(inline="always", nogil=True, cache=True)
def larger(a, b):
    """``a`` if it is larger than ``b``, else ``b``: one compare and select, which LLVM
    vectorizes into a plain max (numba's builtin ``max`` runs about half as fast). NaN loses
    when it is ``a``: the callers look for NaN in their input apart."""
    return a if a > b else b


@njit(inline="always", nogil=True, cache=True)
def _max_into(dst, src):
    for f in range(dst.shape[0]):
        k = np.uint64(f)
        dst[k] = larger(dst[k], src[k])


@njit(inline="always", nogil=True, cache=True)
def _add_into(dst, src):
    for f in range(dst.shape[0]):
        k = np.uint64(f)
        dst[k] += src[k]


@njit(inline="always", nogil=True, cache=True)
def _cell_offset(taps, stack, i, j):
    """Where kernel cell (i, j) starts reading the stacked phase planes."""
    return cell_offset(i, j, taps[6], taps[7], taps[2], taps[3], stack, taps[9])


@njit(inline="always", nogil=True, cache=True)
def _three_into(res, buf, a, b, c, n, first, is_max):
    """``res[k]`` (re)set to, or combined with, ``buf[a + k]``, ``buf[b + k]`` and
    ``buf[c + k]`` in that order for ``k < n``: max, or sum left to right; one loop, indices
    unsigned."""
    a, b, c = np.uint64(a), np.uint64(b), np.uint64(c)
    if is_max and first:
        for f in range(np.uint64(n)):
            res[f] = larger(larger(buf[a + f], buf[b + f]), buf[c + f])
    elif is_max:
        for f in range(np.uint64(n)):
            res[f] = larger(larger(larger(res[f], buf[a + f]), buf[b + f]), buf[c + f])
    elif first:
        for f in range(np.uint64(n)):
            res[f] = (buf[a + f] + buf[b + f]) + buf[c + f]
    else:
        for f in range(np.uint64(n)):
            res[f] = ((res[f] + buf[a + f]) + buf[b + f]) + buf[c + f]


@njit(**NATIVE)
def _flat_group(x, out, p0, planes, group, buf, acc, column, taps, is_max, table):
    """Planes ``p0 .. p0 + planes`` of a pool on stacked phase planes ``buf`` (``group`` planes
    of ``rows`` x ``pitch`` per phase; their pad cells hold the pad value: 0, or -inf for max):
    each kernel cell reads one phase from a fixed offset, so it is one pass over all planes."""
    kh, kw, dh, dw, bh, bw = taps[0], taps[1], taps[2], taps[3], taps[4], taps[5]
    sh, sw, rows, pitch = taps[6], taps[7], taps[8], taps[9]
    oh_count, ow_count = out.shape[1], out.shape[2]
    for g in range(planes):
        fill_phase_planes_late(
            buf[g * rows * pitch :], x[p0 + g], rows, pitch, group * rows * pitch, sh, sw, bh, bw
        )
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
        copy_run(col, buf)
        for i in range(1, kh):
            _max_into(col, buf[i * dh * pitch : i * dh * pitch + wide])
        copy_run(res, col)
        for j in range(1, kw):
            _max_into(res, col[j * dw : j * dw + span])
    elif kw == 3:
        # A kernel row's three cells in one pass, in row-major kernel order as CpuRef adds
        # them (pad cells add 0): three passes for a 3x3 kernel instead of nine.
        for i in range(kh):
            a, b, c = (
                _cell_offset(taps, stack, i, 0),
                _cell_offset(taps, stack, i, 1),
                _cell_offset(taps, stack, i, 2),
            )
            _three_into(res, buf, a, b, c, span, i == 0, is_max)
    else:
        # Cell by cell in row-major kernel order, as CpuRef adds them; pad cells add 0.
        for i in range(kh):
            for j in range(kw):
                offset = _cell_offset(taps, stack, i, j)
                if i == 0 and j == 0:
                    copy_run(res, buf[offset : offset + span])
                elif is_max:
                    _max_into(res, buf[offset : offset + span])
                else:
                    _add_into(res, buf[offset : offset + span])
    hs, hlo, hhi, hcount, wfirst, wlast, wcount, sw_, pw, reciprocal = table
    for g in range(planes):
        p = p0 + g
        if is_max and nan:
            max_plane_late(x[p], out[p], hs, hlo, hhi, dh, wfirst, wlast, sw_, dw, pw, column)
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


@njit(**NATIVE)
def _flat_slice(task, step, x, out, bounds, taps, group, is_max, table):
    """Slice ``task`` of :func:`pool_flat` (a :class:`SliceFunction`)."""
    fill = np.float32(-np.inf) if is_max else np.float32(0)
    phases, rows, pitch = taps[6] * taps[7], taps[8], taps[9]
    buf = np.empty(phases * group * rows * pitch, np.float32)
    for i in range(buf.shape[0]):  # a loop, not np.full: numba compiles a helper for np.full
        buf[i] = fill
    acc = np.empty(2 * group * rows * pitch, np.float32)
    column = np.empty(x.shape[2], np.float32)
    for p0 in range(bounds[task], bounds[task + 1], group):
        planes = min(group, bounds[task + 1] - p0)
        _flat_group(x, out, p0, planes, group, buf, acc, column, taps, is_max, table)


_FLAT_SLICE = SliceFunction(_flat_slice)


def pool_flat(x, out, bounds, taps, group: int, is_max: bool, table: tuple) -> None:
    """A MaxPool or AveragePool whose outputs cover most of their (phase) planes: each slice
    stacks ``group`` planes at a time into zero- (or -inf-) padded phase planes, so that every
    pass is one long loop over all of them instead of a short one per output row."""
    _FLAT_SLICE.run(bounds.shape[0] - 1, (x, out, bounds, taps, group, is_max, table))
