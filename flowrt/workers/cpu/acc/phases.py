"""Strided reads of float32 rows, shared by the kernels that split a plane by its strides
(the conv algorithms of ``conv/``, pools on stacked planes).

``dst[c] = line[c * step]`` as a plain loop is a gather that LLVM leaves scalar: about 2
Gfloat/s. For the common step of 2, :func:`fill_phase_planes` reads the row as 64-bit words,
each one pair of floats, and keeps the low (first) half of each: loads, a truncation and
stores, which vectorize (8-14 Gfloat/s on rows of 28-112). Little-endian machines only, as
numba's targets are.
"""

from __future__ import annotations

import sys

import numpy as np
from numba import njit

if sys.byteorder != "little":  # pragma: no cover - every numba target is little-endian
    raise ImportError("flowrt's CpuAcc kernels expect a little-endian machine")

_LOW = np.uint64(0xFFFFFFFF)


@njit(inline="always", nogil=True, cache=True)
def copy_run(dst, src):
    """``dst[:] = src[: len(dst)]``, as a loop from 0 over views, so that LLVM sees
    non-negative indices and vectorizes."""
    for t in range(dst.shape[0]):
        dst[t] = src[t]


@njit(inline="always", nogil=True, cache=True)
def as_words(flat):
    """A flat float32 array's bits as uint32, and as uint64 words that each hold a pair of
    floats: the pairs from element 0 and the pairs from element 1. Made once per plane: a view
    costs about 20 ns, as much as copying a short row."""
    size = flat.shape[0]
    bits = flat.view(np.uint32)
    even = flat[: size - size % 2].view(np.uint64)
    odd = flat[1 : max(1, size - 1 + size % 2)].view(np.uint64)
    return bits, even, odd


@njit(inline="always", nogil=True, cache=True)
def split_pairs(words, low, high, n):
    """The first ``n`` words, each a pair of floats, into ``low`` (first floats) and ``high``
    (second floats): uint32 views, one vectorized pass."""
    for k in range(n):
        v = words[k]
        low[k] = np.uint32(v & _LOW)
        high[k] = np.uint32(v >> np.uint64(32))


@njit(inline="always", nogil=True, cache=True)
def cell_offset(ki, kj, sh, sw, dh, dw, phase_stride, pitch):
    """Where kernel cell (ki, kj) starts reading the phase planes that
    :func:`fill_phase_planes` makes (``phase_stride`` apart, rows of ``pitch``): its phase
    plane, then its row and column within it."""
    phase = ((ki * dh) % sh) * sw + (kj * dw) % sw
    return phase * phase_stride + (ki * dh // sh) * pitch + kj * dw // sw


@njit(inline="always", nogil=True, cache=True)
def fill_phase_planes(dst, x, rows, pitch, phase_stride, sh, sw, ph, pw):
    """Input plane ``x`` (zero-padded by ``ph`` rows and ``pw`` columns in front) into its
    ``sh * sw`` phase planes: phase (i, j), at ``dst[(i * sw + j) * phase_stride:]``, holds the
    padded plane's cells whose row and column are i and j modulo the strides, ``rows`` x
    ``pitch`` of them (unit strides: one phase, the padded plane itself). Only cells that come
    from ``x`` are written: the pad cells are the same for every plane."""
    height, width = x.shape
    if sw == 2:  # the views cost about 80 ns a plane: only where the pair copy reads them
        bits, even, odd = as_words(x.reshape(-1))
        out = dst.view(np.uint32)
    for i in range(sh):
        # Phase row r reads input row i + r * sh - ph: in [0, height) for r in [r_lo, r_hi).
        r_lo = min(rows, max(0, -(-(ph - i) // sh)))
        r_hi = min(rows, max(r_lo, -(-(height + ph - i) // sh)))
        for j in range(sw):
            base = (i * sw + j) * phase_stride
            # Column c reads input column j + c * sw - pw: in [0, width) for c in [c_lo, c_hi).
            c_lo = min(pitch, max(0, -(-(pw - j) // sw)))
            c_hi = min(pitch, max(c_lo, -(-(width + pw - j) // sw)))
            first = j + c_lo * sw - pw
            for r in range(r_lo, r_hi):
                start = base + r * pitch + c_lo
                source = (i + r * sh - ph) * width + first
                if sw == 2:
                    # The word holding (bits[source + 2c], bits[source + 2c + 1]): its low half
                    # is the first. Unsigned indices and no slices: numba wraps negative
                    # indices around, which keeps LLVM from vectorizing, and a slice costs a
                    # reference count update, as much as a short row.
                    n = c_hi - c_lo
                    words = even if source % 2 == 0 else odd
                    k = np.uint64(source // 2)
                    o = np.uint64(start)
                    for c in range(n - 1):
                        out[o + np.uint64(c)] = np.uint32(words[k + np.uint64(c)] & _LOW)
                    if n > 0:
                        out[o + np.uint64(n - 1)] = bits[np.uint64(source + 2 * (n - 1))]
                elif sw == 1:
                    copy_run(dst[start : start + c_hi - c_lo], x[i + r * sh - ph, first:])
                else:
                    line = x[i + r * sh - ph, first:]
                    for c in range(c_hi - c_lo):
                        dst[np.uint64(start + c)] = line[np.uint64(c * sw)]
