"""im2col: the inputs each output pixel of a Conv sees, copied into the rows of a column matrix.

Row ``r`` of the matrix is kernel cell ``r % (kh * kw)`` of input channel ``r // (kh * kw)``;
column ``q`` is output pixel ``q``. :func:`fill_columns` fills some rows for some pixels of
one image, by the general copy or, for a stride-1 conv whose output is as wide as its input,
by one shifted copy of the flat input per row. :func:`im2col_phases` fills them for a
strided conv from the input's phase planes.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from flowrt.workers.cpu.acc.phases import cell_offset, copy_run


@njit(inline="always", nogil=True, cache=True)
def _zero(dst):
    # Loops from 0 over views, so that LLVM sees non-negative indices and vectorizes.
    for t in range(dst.shape[0]):
        dst[t] = 0


@njit(nogil=True, cache=True)
def _im2col(x_flat, c0, geo, height, width, r0, q0, dst):
    """Fill ``dst`` (rows x q, C-contiguous) with the inputs that output pixels ``q0 .. q0+q``
    see, for the kernel cells ``r0 ..`` of the channels from ``c0`` on (row r: channel
    c0 + r // (kh*kw)). One run per output row of each kernel cell, copied and zeroed cell by
    cell by unsigned index into the flat input and output: a slice or a view costs a
    reference count update (10-20 ns), more than the run of a 7-pixel output row, and a
    negative index keeps LLVM from vectorizing. At stride 2, 2-4x faster than the same loop
    over slices with a pair-of-floats copy; :func:`_im2col_flat` is the faster special case."""
    kh, kw, sh, sw, dh, dw, ph, pw = geo[0], geo[1], geo[2], geo[3], geo[4], geo[5], geo[6], geo[7]
    ow_count = geo[9]
    q = dst.shape[1]
    src = x_flat.reshape(-1)
    out = dst.reshape(-1)
    plane = height * width
    step = np.uint64(sw)
    # The output row and column of pixel q0, where every kernel cell's row starts.
    oh0, ow0 = divmod(q0, ow_count)
    for r in range(r0, r0 + dst.shape[0]):
        ki = (r // kw) % kh
        kj = r % kw
        channel = (c0 + r // (kh * kw)) * plane
        shift = kj * dw - pw
        lo = min(ow_count, max(0, (-shift + sw - 1) // sw))
        hi = max(lo, min(ow_count, (width - 1 - shift) // sw + 1))
        oh, ow = oh0, ow0
        j = (r - r0) * q
        end = j + q
        while j < end:
            run = min(end - j, ow_count - ow)
            ih = oh * sh + ki * dh - ph
            if ih < 0 or ih >= height:
                first = last = ow + run
            else:
                first = min(max(ow, lo), ow + run)
                last = max(first, min(hi, ow + run))
            for t in range(np.uint64(j), np.uint64(j + first - ow)):
                out[t] = 0
            o = np.uint64(j + first - ow)
            s = np.uint64(channel + ih * width + first * sw + shift)
            for t in range(np.uint64(last - first)):
                out[o + t] = src[s + t * step]
            for t in range(np.uint64(j + last - ow), np.uint64(j + run)):
                out[t] = 0
            j += run
            ow = 0
            oh += 1


@njit(nogil=True, cache=True)
def _im2col_flat(x_flat, c0, geo, width, r0, q0, dst):
    """:func:`_im2col` for stride 1 and an output as wide as the input: each kernel cell's row
    is then the flat input shifted by one offset, copied at once; the cells that fall in the
    padding (left and right of each output row, rows above and below) are zeroed after."""
    kh, kw, dh, dw, ph, pw = geo[0], geo[1], geo[4], geo[5], geo[6], geo[7]
    plane = x_flat.shape[1]
    end = q0 + dst.shape[1]
    for r in range(r0, r0 + dst.shape[0]):
        ki = (r // kw) % kh
        kj = r % kw
        src = x_flat[c0 + r // (kh * kw)]
        row = dst[r - r0]
        shift = (ki * dh - ph) * width + kj * dw - pw
        # Pixels whose input row is inside the image: [p_lo, p_hi); of those, readable: [c_lo, c_hi).
        p_lo = min(end, max(q0, (ph - ki * dh) * width))
        p_hi = max(p_lo, min(end, plane + (ph - ki * dh) * width))
        c_lo = min(p_hi, max(p_lo, -shift))
        c_hi = max(c_lo, min(p_hi, plane - shift))
        _zero(row[: c_lo - q0])
        if c_hi > c_lo:
            copy_run(row[c_lo - q0 : c_hi - q0], src[c_lo + shift : c_hi + shift])
        _zero(row[c_hi - q0 :])
        lo = max(0, pw - kj * dw)
        hi = min(width, width + pw - kj * dw)
        if lo == 0 and hi == width:
            continue
        for oh in range(p_lo // width, (p_hi + width - 1) // width):
            base = oh * width
            a = max(base, p_lo)
            _zero(row[a - q0 : max(a, min(base + lo, p_hi)) - q0])
            a = max(base + hi, p_lo)
            _zero(row[a - q0 : max(a, min(base + width, p_hi)) - q0])


@njit(nogil=True, cache=True)
def im2col_phases(phases, c0, geo, rows, pitch, r0, q0, dst):
    """:func:`_im2col` for a strided conv from the phase planes of one image's padded input
    (``phases``: per channel, the ``sh * sw`` planes of ``rows`` x ``pitch`` cells that
    ``phases.fill_phase_planes`` makes, pad cells zero): every kernel cell then reads one
    unit-stride run per output row, with no padding cases. A strided read is a gather that
    LLVM leaves scalar; here the gather is the phase split, once per image and channel."""
    kh, kw, sh, sw, dh, dw = geo[0], geo[1], geo[2], geo[3], geo[4], geo[5]
    ow_count = geo[9]
    q = dst.shape[1]
    out = dst.reshape(-1)
    phase_size = rows * pitch
    oh0, ow0 = divmod(q0, ow_count)
    for r in range(r0, r0 + dst.shape[0]):
        ki = (r // kw) % kh
        kj = r % kw
        channel = (c0 + r // (kh * kw)) * sh * sw * phase_size
        base = channel + cell_offset(ki, kj, sh, sw, dh, dw, phase_size, pitch)
        oh, ow = oh0, ow0
        j = (r - r0) * q
        end = j + q
        while j < end:
            run = min(end - j, ow_count - ow)
            o = np.uint64(j)
            at = np.uint64(base + oh * pitch + ow)
            for t in range(np.uint64(run)):
                out[o + t] = phases[at + t]
            j += run
            ow = 0
            oh += 1


@njit(inline="always", nogil=True, cache=True)
def fill_columns(x, x_flat, c0, geo, r0, q0, dst):
    """The im2col rows ``r0 ..`` (as many as ``dst`` has) for pixels ``q0 ..`` of one image."""
    if geo[2] == 1 and geo[3] == 1 and geo[9] == x.shape[2]:
        _im2col_flat(x_flat, c0, geo, x.shape[2], r0, q0, dst)
    else:
        _im2col(x_flat, c0, geo, x.shape[1], x.shape[2], r0, q0, dst)
