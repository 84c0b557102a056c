"""3x3 stride-1 Conv for CpuAcc by Winograd's F(4x4, 3x3): 36 multiplies per 4x4 output tile
and input channel where F(2x2, 3x3) does 64 and im2col and GEMM 144.

The same scheme as ``winograd.py`` with 6x6 input tiles overlapping by two: sixteen phase
planes per channel, ``V = Bt d B`` per tile, thirty-six GEMMs, ``Y = At M A``. The transforms'
larger coefficients cost accuracy: errors reach about 1e-5 of the output's magnitude (F(2x2,
3x3): 1e-6), as in other engines' F(4x4, 3x3). It pays off where rows of tiles are long:
the algorithm ``winograd_conv.Winograd`` uses it for outputs at least
``WinogradRule.f4_min_side`` wide and high.
"""

from __future__ import annotations

import numpy as np
from numba import njit

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
    """Filters (M, C, 3, 3) as their transforms, one (M, C) matrix per tile element: (36, M, C),
    computed in float64."""
    u = np.einsum("ai,mcij,bj->abmc", _G, np.asarray(w, np.float64), _G)
    return np.ascontiguousarray(u.reshape(36, w.shape[0], w.shape[1]), np.float32)


@njit(inline="always", nogil=True, cache=True)
def _bt(s0, s1, s2, s3, s4, s5, o0, o1, o2, o3, o4, o5, n):
    """``o = Bt s`` elementwise over ``n`` tiles (``s``: six rows, ``o``: six rows), with
    Bt = [[4, 0, -5, 0, 1, 0], [0, -4, -4, 1, 1, 0], [0, 4, -4, -1, 1, 0], [0, -2, -1, 2, 1, 0],
    [0, 2, -1, -2, 1, 0], [0, 4, 0, -5, 0, 1]]."""
    # float32 constants: an integer one would promote the arithmetic to float64
    two, four, five = np.float32(2), np.float32(4), np.float32(5)
    for t in range(n):
        d0, d1, d2, d3, d4, d5 = s0[t], s1[t], s2[t], s3[t], s4[t], s5[t]
        a = d4 - four * d2
        b = d3 - four * d1
        c = d4 - d2
        e = two * (d3 - d1)
        o0[t] = four * d0 - five * d2 + d4
        o1[t] = a + b
        o2[t] = a - b
        o3[t] = c + e
        o4[t] = c - e
        o5[t] = four * d1 - five * d3 + d5


@njit(inline="always", nogil=True, cache=True)
def _at(s0, s1, s2, s3, s4, s5, o0, o1, o2, o3, n):
    """``o = At s`` elementwise over ``n`` tiles, with
    At = [[1, 1, 1, 1, 1, 0], [0, 1, -1, 2, -2, 0], [0, 1, 1, 4, 4, 0], [0, 1, -1, 8, -8, 1]]."""
    two, four, eight = np.float32(2), np.float32(4), np.float32(8)
    for t in range(n):
        m1, m2, m3, m4 = s1[t], s2[t], s3[t], s4[t]
        a = m1 + m2
        b = m1 - m2
        c = m3 + m4
        d = m3 - m4
        o0[t] = s0[t] + a + c
        o1[t] = b + two * d
        o2[t] = a + four * c
        o3[t] = b + eight * d + s5[t]


@njit(nogil=True, cache=True)
def input_transform4(phases, start, pitch, tmp, v, at, n):
    """``v[e, at + t] = (Bt d B)[e]`` for the ``n`` tiles from flat tile ``start`` on of one
    channel's phase planes: Bt over each of the tile's columns into ``tmp``, then over its rows.
    Tile element d[i][j] is phase plane (i % 4, j % 4) from tile (i // 4, j // 4) on."""
    for j in range(6):
        off = start + j // 4
        pj = j % 4
        p0 = phases[0 + pj, off : off + n]
        p1 = phases[4 + pj, off : off + n]
        p2 = phases[8 + pj, off : off + n]
        p3 = phases[12 + pj, off : off + n]
        q = off + pitch
        p4 = phases[0 + pj, q : q + n]
        p5 = phases[4 + pj, q : q + n]
        _bt(
            p0,
            p1,
            p2,
            p3,
            p4,
            p5,
            tmp[j, :n],
            tmp[6 + j, :n],
            tmp[12 + j, :n],
            tmp[18 + j, :n],
            tmp[24 + j, :n],
            tmp[30 + j, :n],
            n,
        )
    b = at + n
    for i in range(6):
        r = 6 * i
        _bt(
            tmp[r, :n],
            tmp[r + 1, :n],
            tmp[r + 2, :n],
            tmp[r + 3, :n],
            tmp[r + 4, :n],
            tmp[r + 5, :n],
            v[r, at:b],
            v[r + 1, at:b],
            v[r + 2, at:b],
            v[r + 3, at:b],
            v[r + 4, at:b],
            v[r + 5, at:b],
            n,
        )


@njit(nogil=True, cache=True)
def output_transform4(mb, at, tmp, y, n):
    """``y[4 * a + b, t] = (At m A)[a, b]`` from ``mb[e, at + t]`` (one output channel's ``n``
    transformed tiles), through ``tmp``."""
    b = at + n
    for j in range(6):
        _at(
            mb[j, at:b],
            mb[6 + j, at:b],
            mb[12 + j, at:b],
            mb[18 + j, at:b],
            mb[24 + j, at:b],
            mb[30 + j, at:b],
            tmp[j, :n],
            tmp[6 + j, :n],
            tmp[12 + j, :n],
            tmp[18 + j, :n],
            n,
        )
    for a in range(4):
        r = 6 * a
        _at(
            tmp[r, :n],
            tmp[r + 1, :n],
            tmp[r + 2, :n],
            tmp[r + 3, :n],
            tmp[r + 4, :n],
            tmp[r + 5, :n],
            y[4 * a, :n],
            y[4 * a + 1, :n],
            y[4 * a + 2, :n],
            y[4 * a + 3, :n],
            n,
        )


@njit(inline="always", nogil=True, cache=True)
def interleave4(dst, y, row, q):
    """``dst[4t + b] = y[row + b, q + t]`` as far as ``dst`` reaches."""
    whole = dst.shape[0] // 4
    y0, y1, y2, y3 = (
        y[row, q : q + whole],
        y[row + 1, q : q + whole],
        y[row + 2, q : q + whole],
        y[row + 3, q : q + whole],
    )
    for t in range(whole):
        dst[4 * t] = y0[t]
        dst[4 * t + 1] = y1[t]
        dst[4 * t + 2] = y2[t]
        dst[4 * t + 3] = y3[t]
    for ow in range(4 * whole, dst.shape[0]):
        dst[ow] = y[row + ow - 4 * whole, q + whole]
