"""MaxPool row by row, the pools that ``pooling.py`` does not stack (strided ones): the max
over each output row's kernel rows into a padded column buffer, then the max along the rows,
a plane at a time, by a function for its stride kind called by address.
"""

from __future__ import annotations

import numpy as np
from numba import njit, types

from flowrt.workers.cpu.acc.calls import NATIVE, SliceFunction, call_native, native_address
from flowrt.workers.cpu.acc.kernels.pool_vectors import LANES, max3_pairs, max3_rows
from flowrt.workers.cpu.acc.kernels.stacked_pooling import larger, max_plane_late
from flowrt.workers.cpu.acc.phases import pair_high, pair_low

# The max along the rows of kernel-row maxima of a plane, one function per stride kind, called
# by address from _max_planes, once a plane: a pool compiles only its own (``_ALONG``). Each
# takes (of, at, count, columns, span, rows, even, odd, kw_count, sw, dw) and sets, for each
# of ``rows`` rows ``r``, ``of[at + r * count + o]`` to the max of
# ``columns[r * span + o * sw + k * dw]`` over the kernel cells ``k``, for ``o < count``: one
# pass per cell.


@njit(**NATIVE)
def _along_unit(of, at, count, columns, span, rows, even, odd, kw_count, sw, dw):
    """Stride 1 (``even`` and ``odd`` unused)."""
    u8 = np.uint64
    for r in range(rows):
        base, column = u8(at + r * count), u8(r * span)
        for o in range(u8(count)):
            of[base + o] = columns[column + o]
        for k in range(1, kw_count):
            shift = column + u8(k * dw)
            for o in range(u8(count)):
                of[base + o] = larger(of[base + o], columns[shift + o])


@njit(**NATIVE)
def _along_pairs(of, at, count, columns, span, rows, even, odd, kw_count, sw, dw):
    """Stride 2. The classic 3x3 window reads its three cells from the row at once (LLVM
    vectorizes the stride-2 reads well: twice as fast as splitting the row first). Other
    windows first split each row into its even and odd cells (``even``, ``odd``), by 64-bit
    loads of pairs, so that every pass reads one of them at unit stride."""
    u8 = np.uint64
    pairs = u8(((count - 1) * 2 + (kw_count - 1) * dw) // 2 + 1)
    for r in range(rows):
        base, column = u8(at + r * count), u8(r * span)
        if kw_count == 3 and dw == 1:  # the classic 3x3 stride-2 pool, a vector at a time
            for o in range(0, count, LANES):
                max3_pairs(of, base + u8(o), columns, column + u8(2 * o), min(LANES, count - o))
            continue
        for k in range(pairs):
            even[k] = pair_low(columns, column + u8(2) * k)
            odd[k] = pair_high(columns, column + u8(2) * k)
        for o in range(u8(count)):
            of[base + o] = even[o]
        for k in range(1, kw_count):
            shift = u8(k * dw // 2)
            cells = even if k * dw % 2 == 0 else odd
            for o in range(u8(count)):
                of[base + o] = larger(of[base + o], cells[shift + o])


@njit(**NATIVE)
def _along_any(of, at, count, columns, span, rows, even, odd, kw_count, sw, dw):
    """Any other stride (``even`` and ``odd`` unused)."""
    for r in range(rows):
        base, column = np.uint64(at + r * count), r * span
        for o in range(count):
            of[base + np.uint64(o)] = columns[np.uint64(column + o * sw)]
        for k in range(1, kw_count):
            for o in range(count):
                q = np.uint64(o)
                of[base + q] = larger(of[base + q], columns[np.uint64(column + o * sw + k * dw)])


_ROW, _COUNT = types.Array(types.float32, 1, "C"), types.int64
_ALONG_TYPES = (_ROW, _COUNT, _COUNT, _ROW, _COUNT, _COUNT, _ROW, _ROW, _COUNT, _COUNT, _COUNT)
_ALONG = {1: _along_unit, 2: _along_pairs}
_along_addresses: dict[int, int] = {}


def along_address(sw: int) -> int:
    """The address of the max along the rows at stride ``sw``, compiled on first use."""
    kind = sw if sw in _ALONG else 0
    found = _along_addresses.get(kind)
    if found is None:
        found = _along_addresses[kind] = native_address(_ALONG.get(kind, _along_any), _ALONG_TYPES)
    return found


@njit(**NATIVE)
def _max_planes(s, _step, bounds, x, out, hs, hlo, hhi, dh, wfirst, wlast, sw, dw, pw, along):
    """MaxPool's slice ``s`` of planes (a :class:`SliceFunction`), each plane by :func:`larger`
    (vectorized; it lets NaN lose), noting NaN in the rows it reads: a plane that has one is
    computed again by ``max_plane_exact``. ``along``: the address of the max along the rows
    for stride ``sw`` (:func:`along_address`).

    The kernel rows' max of each output row goes into a row of a column buffer, ``span``
    apart, with ``pw`` cells of -inf before it and enough after it for every window: padding
    never wins, and no window needs a bounds test. Up to three kernel rows at a time are one
    pass over the columns. The loops index flat views with unsigned offsets: a slice per row
    costs reference counting that took as long as the row's max."""
    height, width, kw_count = x.shape[1], x.shape[2], wfirst.shape[0]
    oh_count, ow_count = out.shape[1], out.shape[2]
    xf, of = x.reshape(-1), out.reshape(-1)
    lowest = np.float32(-np.inf)
    span = max(pw + width, (ow_count - 1) * sw + (kw_count - 1) * dw + 1)
    span += span % 2  # whole pairs, for the split at stride 2
    padded = np.empty(oh_count * span + 2 * LANES + 2, np.float32)  # max3_pairs reads past a row
    for i in range(padded.shape[0]):  # a loop, not np.full: numba compiles a helper for np.full
        padded[i] = lowest
    even, odd = np.empty(span // 2, np.float32), np.empty(span // 2, np.float32)
    exact = np.empty(width, np.float32)
    for p in range(bounds[s], bounds[s + 1]):
        nan = False
        for oh in range(oh_count):
            at = oh * span + pw
            if hhi[oh] == hlo[oh]:  # no kernel row inside the input: -inf throughout
                for i in range(width):
                    padded[np.uint64(at + i)] = lowest
                continue
            # up to three kernel rows in one pass (fewer: a row read twice), a vector at a
            # time, in this loop: a function taking the arrays cost their reference counts
            # at each row, more than the row's max
            first = (p * height + hs[oh] + hlo[oh] * dh) * width
            count = min(3, hhi[oh] - hlo[oh])
            second = first + min(1, count - 1) * dh * width
            third = first + (count - 1) * dh * width
            for i in range(0, width, LANES):
                nan |= max3_rows(padded, at + i, xf, first + i, second + i, third + i, min(LANES, width - i))
            for kh in range(hlo[oh] + 3, hhi[oh]):
                line = np.uint64((p * height + hs[oh] + kh * dh) * width)
                for i in range(width):
                    q = np.uint64(i)
                    v = xf[line + q]
                    padded[np.uint64(at) + q] = larger(padded[np.uint64(at) + q], v)
                    nan |= v != v
        args = (of, p * oh_count * ow_count, ow_count, padded, span, oh_count, even, odd, kw_count, sw, dw)
        call_native(along, args)
        if nan:
            max_plane_late(x[p], out[p], hs, hlo, hhi, dh, wfirst, wlast, sw, dw, pw, exact)


MAX_PLANES = SliceFunction(_max_planes)
