"""3x3 stride-1 Conv for CpuAcc by Winograd's F(4x4, 3x3): 36 multiplies per 4x4 output tile
and input channel where F(2x2, 3x3) does 64 and im2col and GEMM 144.

The same scheme as ``winograd.py`` with 6x6 input tiles overlapping by two: sixteen phase
planes per channel, ``V = Bt d B`` per tile, thirty-six GEMMs, ``Y = At M A``. The transforms'
larger coefficients cost accuracy: errors reach about 5e-6 of the output's magnitude (F(2x2,
3x3), im2col and GEMM: 2-3e-7), as in other engines' F(4x4, 3x3). It pays off where rows of
tiles are long: the algorithm ``winograd_conv.Winograd`` uses it for outputs at least
``WinogradRule.f4_min_side`` wide and high, in networks optimized with ``fast_math``.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from flowrt.engine.graph.winograd import filter_transforms
from flowrt.workers.cpu.acc.calls import NATIVE
from flowrt.workers.cpu.acc.kernels.pool_vectors import interleave4_vector
from flowrt.workers.cpu.acc.tile_ir import LANES

# F(4x4, 3x3): G (6x3) maps a 3-tap filter to its transform.
_G = np.array(
    [
        [1 / 4, 0, 0],
        [-1 / 6, -1 / 6, -1 / 6],
        [-1 / 6, 1 / 6, -1 / 6],
        [1 / 24, 1 / 12, 1 / 6],
        [1 / 24, -1 / 12, 1 / 6],
        [0, 0, 1],
    ]
)


def winograd4_weights(w: np.ndarray) -> np.ndarray:
    """Filters (M, C, 3, 3) as their transforms, one (M, C) matrix per tile element: (36, M, C)."""
    return filter_transforms(_G, w)


# As F(2x2)'s (``winograd.py``): flat arrays and unsigned offsets, called by address. Each
# transform is one loop over its passes, whose rows are picked by offset: one copy of the
# loop body to compile, not one per pass.


@njit(**NATIVE)
def input_transform4(phases, base, size, start, pitch, tmp, v, vrow, at, n):
    """``v[e * vrow + at + t] = (Bt d B)[e]`` for the ``n`` tiles from flat tile ``start`` on
    of the channel whose phase planes are ``phases[base:]``, ``size`` apart: Bt over each of
    the tile's columns into ``tmp`` (36 rows of ``n``), then over its rows. Tile element
    d[i][j] is phase plane (i % 4, j % 4) from tile (i // 4, j // 4) on. With
    Bt = [[4, 0, -5, 0, 1, 0], [0, -4, -4, 1, 1, 0], [0, 4, -4, -1, 1, 0], [0, -2, -1, 2, 1, 0],
    [0, 2, -1, -2, 1, 0], [0, 4, 0, -5, 0, 1]]."""
    u8 = np.uint64
    # float32 constants: an integer one would promote the arithmetic to float64
    two, four, five = np.float32(2), np.float32(4), np.float32(5)
    plane, count = u8(size), u8(n)
    for step in range(12):
        if step < 6:  # column j of the tiles: planes (i % 4, j % 4), i = 0..5, into tmp
            j = step
            src, dst = phases, tmp
            s0 = u8(base + start + j // 4) + u8(j % 4) * plane
            s1, s2, s3 = s0 + u8(4) * plane, s0 + u8(8) * plane, s0 + u8(12) * plane
            s4 = s0 + u8(pitch)
            s5 = s4 + u8(4) * plane
            d0, dr = u8(j) * count, u8(6) * count
        else:  # row i of tmp into v
            i = u8(6 * (step - 6))
            src, dst = tmp, v
            s0 = i * count
            s1, s2, s3, s4, s5 = (
                s0 + count,
                s0 + u8(2) * count,
                s0 + u8(3) * count,
                s0 + u8(4) * count,
                s0 + u8(5) * count,
            )
            d0, dr = i * u8(vrow) + u8(at), u8(vrow)
        d1, d2, d3, d4, d5 = d0 + dr, d0 + u8(2) * dr, d0 + u8(3) * dr, d0 + u8(4) * dr, d0 + u8(5) * dr
        for t in range(count):
            x0, x1, x2, x3, x4, x5 = (
                src[s0 + t],
                src[s1 + t],
                src[s2 + t],
                src[s3 + t],
                src[s4 + t],
                src[s5 + t],
            )
            a = x4 - four * x2
            b = x3 - four * x1
            c = x4 - x2
            e = two * (x3 - x1)
            dst[d0 + t] = four * x0 - five * x2 + x4
            dst[d1 + t] = a + b
            dst[d2 + t] = a - b
            dst[d3 + t] = c + e
            dst[d4 + t] = c - e
            dst[d5 + t] = four * x1 - five * x3 + x5


@njit(**NATIVE)
def output_transform4(m, mrow, at, tmp, y, yrow, n):
    """``y[(4 * a + b) * yrow + t] = (At m A)[a, b]`` from ``m[e * mrow + at + t]`` (one output
    channel's ``n`` transformed tiles), through ``tmp`` (24 rows of ``n``), with
    At = [[1, 1, 1, 1, 1, 0], [0, 1, -1, 2, -2, 0], [0, 1, 1, 4, 4, 0], [0, 1, -1, 8, -8, 1]]."""
    u8 = np.uint64
    two, four, eight = np.float32(2), np.float32(4), np.float32(8)
    count = u8(n)
    for step in range(10):
        if step < 6:  # column j of the transformed tiles into tmp
            j = u8(step)
            src, dst = m, tmp
            s0, sr = j * u8(mrow) + u8(at), u8(6 * mrow)
            d0, dr = j * count, u8(6) * count
        else:  # row a of tmp into y
            a = u8(step - 6)
            src, dst = tmp, y
            s0, sr = u8(6) * a * count, count
            d0, dr = u8(4) * a * u8(yrow), u8(yrow)
        s1, s2, s3, s4, s5 = s0 + sr, s0 + u8(2) * sr, s0 + u8(3) * sr, s0 + u8(4) * sr, s0 + u8(5) * sr
        d1, d2, d3 = d0 + dr, d0 + u8(2) * dr, d0 + u8(3) * dr
        for t in range(count):
            m1, m2, m3, m4 = src[s1 + t], src[s2 + t], src[s3 + t], src[s4 + t]
            a_ = m1 + m2
            b_ = m1 - m2
            c_ = m3 + m4
            d_ = m3 - m4
            dst[d0 + t] = src[s0 + t] + a_ + c_
            dst[d1 + t] = b_ + two * d_
            dst[d2 + t] = a_ + four * c_
            dst[d3 + t] = b_ + eight * d_ + src[s5 + t]


@njit(**NATIVE)
def interleave4(dst, at, width, y, row, yrow):
    """``dst[at + 4t + b] = y[row + b * yrow + t]`` for the ``width`` outputs of a row,
    ``4 * LANES`` at a time as shuffled vectors (``winograd.interleave2``)."""
    for t in range(0, width, 4 * LANES):
        interleave4_vector(dst, at + t, y, row + t // 4, yrow, min(4 * LANES, width - t))
