"""im2col: the inputs each output pixel of a Conv sees, copied into the rows of a column matrix.

Row ``r`` of the matrix is kernel cell ``r % (kh * kw)`` of input channel ``r // (kh * kw)``;
column ``q`` is output pixel ``q``. :func:`fill_columns` fills some rows for some pixels of
one image, by the general copy or, for a stride-1 conv whose output is as wide as its input,
by one shifted copy of the flat input per row.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from flowrt.workers.cpu.acc.kernels.phases import as_words, copy_every_other


@njit(inline="always", nogil=True, cache=True)
def _zero(dst):
    # Loops from 0 over views, so that LLVM sees non-negative indices and vectorizes.
    for t in range(dst.shape[0]):
        dst[t] = 0


@njit(inline="always", nogil=True, cache=True)
def _copy(dst, src):
    for t in range(dst.shape[0]):
        dst[t] = src[t]


@njit(nogil=True, cache=True)
def _im2col(x, c0, geo, r0, q0, dst):
    """Fill ``dst`` (rows x q) with the inputs that output pixels ``q0 .. q0+q`` see, for the
    kernel cells ``r0 ..`` of the channels from ``c0`` on (row r: channel c0 + r // (kh*kw)).
    One copy per output row of each kernel cell; :func:`_im2col_flat` is the faster special case."""
    kh, kw, sh, sw, dh, dw, ph, pw = geo[0], geo[1], geo[2], geo[3], geo[4], geo[5], geo[6], geo[7]
    ow_count = geo[9]
    height, width = x.shape[1], x.shape[2]
    q = dst.shape[1]
    for r in range(r0, r0 + dst.shape[0]):
        ki = (r // kw) % kh
        kj = r % kw
        channel = x[c0 + r // (kh * kw)]
        row = dst[r - r0]
        # Output columns whose input column lies inside the image: [lo, hi).
        shift = kj * dw - pw
        lo = min(ow_count, max(0, (-shift + sw - 1) // sw))
        hi = max(lo, min(ow_count, (width - 1 - shift) // sw + 1))
        oh, ow = divmod(q0, ow_count)
        j = 0
        while j < q:
            run = min(q - j, ow_count - ow)
            ih = oh * sh + ki * dh - ph
            if ih < 0 or ih >= height:
                _zero(row[j : j + run])
            else:
                first = min(max(ow, lo), ow + run)
                last = max(first, min(hi, ow + run))
                _zero(row[j : j + first - ow])
                if last > first:
                    src = channel[ih, first * sw + shift : (last - 1) * sw + shift + 1 : sw]
                    _copy(row[j + first - ow : j + last - ow], src)
                _zero(row[j + last - ow : j + run])
            j += run
            ow = 0
            oh += 1


@njit(nogil=True, cache=True)
def _im2col_pairs(x, c0, geo, r0, q0, dst):
    """:func:`_im2col` for a horizontal stride of 2: each channel's rows read as pairs of floats
    (see ``phases.py``), which vectorizes where a stride-2 read does not. A twin rather than a
    branch inside :func:`_im2col`: with the branch there, every conv through the general path
    (alexnet's stride-4 one too) ran with ten times the page faults and 10-15% slower while
    two workers streamed."""
    kh, kw, sh, sw, dh, dw, ph, pw = geo[0], geo[1], geo[2], geo[3], geo[4], geo[5], geo[6], geo[7]
    ow_count = geo[9]
    height, width = x.shape[1], x.shape[2]
    q = dst.shape[1]
    for r in range(r0, r0 + dst.shape[0]):
        ki = (r // kw) % kh
        kj = r % kw
        channel = x[c0 + r // (kh * kw)]
        row = dst[r - r0]
        bits, even, odd = as_words(channel.reshape(-1))
        out = row.view(np.uint32)
        # Output columns whose input column lies inside the image: [lo, hi).
        shift = kj * dw - pw
        lo = min(ow_count, max(0, (-shift + sw - 1) // sw))
        hi = max(lo, min(ow_count, (width - 1 - shift) // sw + 1))
        oh, ow = divmod(q0, ow_count)
        j = 0
        while j < q:
            run = min(q - j, ow_count - ow)
            ih = oh * sh + ki * dh - ph
            if ih < 0 or ih >= height:
                _zero(row[j : j + run])
            else:
                first = min(max(ow, lo), ow + run)
                last = max(first, min(hi, ow + run))
                _zero(row[j : j + first - ow])
                if last > first:
                    source = ih * width + first * sw + shift
                    copy_every_other(out, j + first - ow, bits, even, odd, source, last - first)
                _zero(row[j + last - ow : j + run])
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
            _copy(row[c_lo - q0 : c_hi - q0], src[c_lo + shift : c_hi + shift])
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


@njit(inline="always", nogil=True, cache=True)
def fill_columns(x, x_flat, c0, geo, r0, q0, dst):
    """The im2col rows ``r0 ..`` (as many as ``dst`` has) for pixels ``q0 ..`` of one image."""
    if geo[2] == 1 and geo[3] == 1 and geo[9] == x.shape[2]:
        _im2col_flat(x_flat, c0, geo, x.shape[2], r0, q0, dst)
    elif geo[3] == 2:
        _im2col_pairs(x, c0, geo, r0, q0, dst)
    else:
        _im2col(x, c0, geo, r0, q0, dst)
