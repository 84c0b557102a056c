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
from llvmlite import ir
from numba import njit, types
from numba.extending import intrinsic

from flowrt.workers.cpu.acc.calls import LateFunction, call_late

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


def _pair_half(high: bool):
    def typer(typingctx, a, i):
        """``a[i]`` (``high``: ``a[i + 1]``) of a float32 array, as one half of the 64-bit word
        at ``a[i]``: a load that LLVM vectorizes where a read of every other float is a
        gather it leaves scalar. ``i`` is an integer index, not checked."""

        def codegen(context, builder, signature, args):
            data = context.make_array(signature.args[0])(context, builder, args[0]).data
            word = builder.load(
                builder.bitcast(builder.gep(data, [args[1]]), ir.IntType(64).as_pointer()), align=4
            )
            if high:
                word = builder.lshr(word, ir.Constant(ir.IntType(64), 32))
            return builder.bitcast(builder.trunc(word, ir.IntType(32)), ir.FloatType())

        return types.float32(a, i), codegen

    return intrinsic(typer)


# pair_low(a, i) is a[i] and pair_high(a, i) is a[i + 1], both read by a 64-bit load at a[i]
# (which must lie inside the array): views of a as uint64 words do the same, but each view
# costs numba a helper to compile and 15 ms per use.
pair_low, pair_high = _pair_half(False), _pair_half(True)


@njit(inline="always", nogil=True, cache=True)
def phase_span(phase, extent, cells, stride, pad):
    """The cells ``[lo, hi)`` of ``cells`` along one axis of phase ``phase`` that come from
    the input: cell ``r`` reads input index ``phase + r * stride - pad``, inside ``[0,
    extent)`` for ``r`` in that range; the others are pad cells."""
    lo = min(cells, max(0, -(-(pad - phase) // stride)))
    return lo, min(cells, max(lo, -(-(extent + pad - phase) // stride)))


# Not inlined: the kernels that split planes (conv columns, grouped and depthwise convs, stacked
# pools) call it once a plane, and each inlined copy cost its kernel 0.5-1 s to compile. It
# indexes the flat plane by unsigned offsets, with no views: each view of the plane as words
# cost as much to compile as a loop, and a negative index keeps LLVM from vectorizing.
@njit(nogil=True, cache=True, no_cfunc_wrapper=True)  # type: ignore[call-overload]  # numba's stubs lack no_cfunc_wrapper
def fill_phase_planes(dst, x, rows, pitch, phase_stride, sh, sw, ph, pw):
    """Input plane ``x`` (zero-padded by ``ph`` rows and ``pw`` columns in front) into its
    ``sh * sw`` phase planes: phase (i, j), at ``dst[(i * sw + j) * phase_stride:]``, holds the
    padded plane's cells whose row and column are i and j modulo the strides, ``rows`` x
    ``pitch`` of them (unit strides: one phase, the padded plane itself). Only cells that come
    from ``x`` are written: the pad cells are the same for every plane."""
    height, width = x.shape
    src = x.reshape(-1)
    u8 = np.uint64
    for i in range(sh):
        r_lo, r_hi = phase_span(i, height, rows, sh, ph)
        for j in range(sw):
            c_lo, c_hi = phase_span(j, width, pitch, sw, pw)
            n = c_hi - c_lo
            for r in range(r_lo, r_hi):
                o = u8((i * sw + j) * phase_stride + r * pitch + c_lo)
                s = u8((i + r * sh - ph) * width + j + c_lo * sw - pw)
                if sw == 2:
                    # The first float of each pair by a 64-bit load (pair_low), but for the
                    # last cell, whose pair may end past the plane.
                    for c in range(u8(max(0, n - 1))):
                        dst[o + c] = pair_low(src, s + u8(2) * c)
                    if n > 0:
                        dst[o + u8(n - 1)] = src[s + u8(2 * (n - 1))]
                elif sw == 1:
                    for c in range(u8(n)):
                        dst[o + c] = src[s + c]
                else:
                    for c in range(u8(n)):
                        dst[o + c] = src[s + u8(sw) * c]


# The kernels reach fill_phase_planes through a slot (``calls.LateFunction``): compiled once,
# at its first call, and linked into none of them (each copy linked in was compiled again
# with its kernel).
FILL_PHASE_PLANES_NAME = "flowrt_fill_phase_planes"
FILL_PHASE_PLANES = LateFunction(
    fill_phase_planes,
    (types.Array(types.float32, 1, "C"), types.Array(types.float32, 2, "C"), *[types.int64] * 7),
    FILL_PHASE_PLANES_NAME,
)


@njit(inline="always", nogil=True, cache=True)
def fill_phase_planes_late(dst, x, rows, pitch, phase_stride, sh, sw, ph, pw):
    """:func:`fill_phase_planes` through its slot (``FILL_PHASE_PLANES``)."""
    i8 = np.int64
    sizes = (i8(rows), i8(pitch), i8(phase_stride), i8(sh), i8(sw), i8(ph), i8(pw))
    call_late(FILL_PHASE_PLANES_NAME, (dst, x) + sizes)
