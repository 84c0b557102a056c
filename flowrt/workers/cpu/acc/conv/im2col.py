"""im2col: the inputs each output pixel of a Conv sees, copied into the rows of a column matrix.

Row ``r`` of the matrix is kernel cell ``r % (kh * kw)`` of input channel ``r // (kh * kw)``;
column ``q`` is output pixel ``q``. Three fills, one for each kind of conv, all called by
address with one argument list (:data:`FILL_ARGS`), so that a kernel links none of them and
compiles only those its convs use (:func:`fill_address`): :func:`im2col` the general copy,
:func:`im2col_flat` one shifted copy of the flat input per row for a stride-1 conv whose
output is as wide as its input, :func:`im2col_phases` a strided conv's rows from the input's
phase planes. :func:`fill_columns` picks one and calls it, for callers that hold views.

They index flat arrays by unsigned offsets: a slice or a view costs a reference count update
(10-20 ns, more than the run of a 7-pixel output row) and numba as much to compile as a loop,
and a negative index keeps LLVM from vectorizing.
"""

from __future__ import annotations

import numba
import numpy as np
from numba import njit, types
from numba._dispatcher import compute_fingerprint

from flowrt.workers.cpu.acc.calls import NATIVE, native_address
from flowrt.workers.cpu.acc.phases import cell_offset


@njit(**NATIVE)
def _zero(dst, start, stop):
    """``dst[start:stop] = 0`` (an empty run when ``stop <= start``)."""
    for t in range(np.uint64(start), np.uint64(max(start, stop))):
        dst[t] = 0


@njit(**NATIVE)
def im2col(src, at, c0, geo, height, width, r0, q0, dst, dst_at, rows, q):
    """Fill ``rows`` rows of ``q`` columns of the C-contiguous matrix at ``dst[dst_at:]`` with
    the inputs that output pixels ``q0 .. q0+q`` see, for the kernel cells ``r0 ..`` of the
    channels from ``c0`` on (row r: channel c0 + r // (kh*kw)) of the (channels, ``height``,
    ``width``) image at ``src[at:]``. One run per output row of each kernel cell, copied and
    zeroed cell by cell. At stride 2, 2-4x faster than the same loop over slices with a
    pair-of-floats copy; :func:`im2col_flat` is the faster special case."""
    kh, kw, sh, sw, dh, dw, ph, pw = geo[0], geo[1], geo[2], geo[3], geo[4], geo[5], geo[6], geo[7]
    ow_count = geo[9]
    plane = height * width
    step = np.uint64(sw)
    # The output row and column of pixel q0, where every kernel cell's row starts.
    oh0, ow0 = divmod(q0, ow_count)
    for r in range(r0, r0 + rows):
        ki = (r // kw) % kh
        kj = r % kw
        channel = at + (c0 + r // (kh * kw)) * plane
        shift = kj * dw - pw
        lo = min(ow_count, max(0, (-shift + sw - 1) // sw))
        hi = max(lo, min(ow_count, (width - 1 - shift) // sw + 1))
        oh, ow = oh0, ow0
        j = dst_at + (r - r0) * q
        end = j + q
        while j < end:
            run = min(end - j, ow_count - ow)
            ih = oh * sh + ki * dh - ph
            if ih < 0 or ih >= height:
                first = last = ow + run
            else:
                first = min(max(ow, lo), ow + run)
                last = max(first, min(hi, ow + run))
            _zero(dst, j, j + first - ow)
            o = np.uint64(j + first - ow)
            s = np.uint64(channel + ih * width + first * sw + shift)
            for t in range(np.uint64(last - first)):
                dst[o + t] = src[s + t * step]
            _zero(dst, j + last - ow, j + run)
            j += run
            ow = 0
            oh += 1


@njit(**NATIVE)
def im2col_flat(src, at, c0, geo, height, width, r0, q0, dst, dst_at, rows, q):
    """:func:`im2col` for stride 1 and an output as wide as the input: each kernel cell's row
    is then the flat input shifted by one offset, copied at once; the cells that fall in the
    padding (left and right of each output row, rows above and below) are zeroed after."""
    kh, kw, dh, dw, ph, pw = geo[0], geo[1], geo[4], geo[5], geo[6], geo[7]
    plane = height * width
    end = q0 + q
    for r in range(r0, r0 + rows):
        ki = (r // kw) % kh
        kj = r % kw
        channel = at + (c0 + r // (kh * kw)) * plane
        row = dst_at + (r - r0) * q - q0  # pixel p goes to dst[row + p]
        shift = (ki * dh - ph) * width + kj * dw - pw
        # Pixels whose input row is inside the image: [p_lo, p_hi); of those, readable: [c_lo, c_hi).
        p_lo = min(end, max(q0, (ph - ki * dh) * width))
        p_hi = max(p_lo, min(end, plane + (ph - ki * dh) * width))
        c_lo = min(p_hi, max(p_lo, -shift))
        c_hi = max(c_lo, min(p_hi, plane - shift))
        _zero(dst, row + q0, row + c_lo)
        o, s = np.uint64(row + c_lo), np.uint64(channel + c_lo + shift)
        for t in range(np.uint64(c_hi - c_lo)):
            dst[o + t] = src[s + t]
        _zero(dst, row + c_hi, row + end)
        lo = max(0, pw - kj * dw)
        hi = min(width, width + pw - kj * dw)
        if lo == 0 and hi == width:
            continue
        for oh in range(p_lo // width, (p_hi + width - 1) // width):
            base = oh * width
            a = max(base, p_lo)
            _zero(dst, row + a, row + max(a, min(base + lo, p_hi)))
            a = max(base + hi, p_lo)
            _zero(dst, row + a, row + max(a, min(base + width, p_hi)))


@njit(**NATIVE)
def im2col_phases(src, at, c0, geo, height, width, r0, q0, dst, dst_at, rows, q):
    """:func:`im2col` for a strided conv from the phase planes of one image's padded input at
    ``src[at:]`` (per channel, the ``sh * sw`` planes of ``height`` x ``width`` cells that
    ``phases.fill_phase_planes`` makes, pad cells zero): every kernel cell then reads one
    unit-stride run per output row, with no padding cases. A strided read is a gather that
    LLVM leaves scalar; here the gather is the phase split, once per image and channel."""
    kh, kw, sh, sw, dh, dw = geo[0], geo[1], geo[2], geo[3], geo[4], geo[5]
    ow_count = geo[9]
    phase_size = height * width
    oh0, ow0 = divmod(q0, ow_count)
    for r in range(r0, r0 + rows):
        ki = (r // kw) % kh
        kj = r % kw
        channel = at + (c0 + r // (kh * kw)) * sh * sw * phase_size
        base = channel + cell_offset(ki, kj, sh, sw, dh, dw, phase_size, width)
        oh, ow = oh0, ow0
        j = dst_at + (r - r0) * q
        end = j + q
        while j < end:
            run = min(end - j, ow_count - ow)
            o = np.uint64(j)
            s = np.uint64(base + oh * width + ow)
            for t in range(np.uint64(run)):
                dst[o + t] = src[s + t]
            j += run
            ow = 0
            oh += 1


_ROW = types.Array(types.float32, 1, "C")
# What every fill takes, but the type of ``src`` (read-only or not):
# (src, at, c0, geo, height, width, r0, q0, dst, dst_at, rows, q).
_FILLS = {"general": im2col, "flat": im2col_flat, "phases": im2col_phases}
_addresses: dict[tuple, int] = {}


def fill_kind(geo: np.ndarray, width: int, phased: bool) -> str:
    """Which fill makes a conv's columns: from phase planes when ``phased``, the flat copy for
    stride 1 and an output row as wide as the input's (``width``), else the general one."""
    if phased:
        return "phases"
    return "flat" if geo[2] == 1 and geo[3] == 1 and geo[9] == width else "general"


def fill_address(kind: str, src: np.ndarray, geo: np.ndarray) -> int:
    """The address of the fill ``kind`` (:func:`fill_kind`) for a flat float32 ``src`` and
    the int64 ``geo``, as they are passed (read-only or not), compiled (or loaded from numba's
    cache) on first use."""
    key = (kind, compute_fingerprint(src), compute_fingerprint(geo))  # numba.typeof's, faster
    found = _addresses.get(key)
    if found is None:
        signature = (numba.typeof(src), *[types.int64] * 2, numba.typeof(geo), *[types.int64] * 4, _ROW,
                     *[types.int64] * 3)  # fmt: skip
        found = _addresses[key] = native_address(_FILLS[kind], signature)
    return found


@njit(nogil=True, cache=True, no_cfunc_wrapper=True)  # type: ignore[call-overload]  # numba's stubs lack no_cfunc_wrapper
def fill_columns(x, x_flat, c0, geo, r0, q0, dst):
    """The im2col rows ``r0 ..`` (as many as ``dst`` has) for pixels ``q0 ..`` of one image
    ``x`` (channels, height, width), ``x_flat`` its (channels, pixels) view; ``dst``
    C-contiguous."""
    height, width = x.shape[1], x.shape[2]
    src, out = x_flat.reshape(-1), dst.reshape(-1)
    rows, q = dst.shape[0], dst.shape[1]
    if geo[2] == 1 and geo[3] == 1 and geo[9] == width:
        im2col_flat(src, 0, c0, geo, height, width, r0, q0, out, 0, rows, q)
    else:
        im2col(src, 0, c0, geo, height, width, r0, q0, out, 0, rows, q)
