"""3x3 stride-1 Conv for CpuAcc by Winograd's minimal filtering F(2x2, 3x3), as the Arm Compute
Library's ``NEWinogradConvolutionLayer`` does: 16 multiplies per 2x2 output tile and input
channel where im2col and GEMM do 36.

Each 4x4 input tile ``d`` (overlapping its neighbours by two) becomes ``V = Bt d B``, each
3x3 filter ``g`` becomes ``U = G g Gt`` (once, at load), and the sixteen elements of the 4x4
transformed tiles are sixteen independent GEMMs: ``Mx = Ux @ Vx`` over the channels. The
output tile is ``Y = At M A``. The algorithm ``winograd_conv.Winograd`` takes the layers
where it is faster (:class:`WinogradRule`).

Layout. The input is first copied, zero-padded, into four *phase planes* per channel (the
padded pixels whose row and column are even or odd, each plane ``tiles_w + 1`` wide), so that
for any tile element ``d[i, j]`` the tiles of a row of tiles read one contiguous run of a
phase plane. The window is rows of tiles: a slice transforms ``block`` tile rows at a time
(enough tiles to keep the GEMMs wide, few enough for the transformed tiles to stay near the
cache), runs the sixteen GEMMs, and transforms back with bias and activation. Small images of
a batch are transformed a few at a time, their rows of tiles one image after another, so that
a block has as many tiles as a larger image's (:func:`winograd_blocks`). This file holds
F(2x2, 3x3)'s transforms and the layout; the loop nest, shared with F(4x4, 3x3)
(``winograd4.py``), is ``winograd_conv.py``.
"""

from __future__ import annotations

import attrs
import numpy as np
from numba import njit

# Winograd F(2x2, 3x3): G (4x3) maps a 3-tap filter to its transform.
_G = np.array([[1.0, 0.0, 0.0], [0.5, 0.5, 0.5], [0.5, -0.5, 0.5], [0.0, 0.0, 1.0]])
# A block of tile rows aims at this many tiles (GEMM columns).
BLOCK_TILES = 256
# Images with fewer tiles than this are transformed a few at a time (:func:`winograd_blocks`).
GROUP_TILES = 64


@attrs.frozen
class WinogradRule:
    """Which 3x3 stride-1 convs of one group run faster by Winograd than by im2col and GEMM
    (measured on 1 to 2 cores): enough input channels for the GEMMs to be deep, enough output
    pixels for them to be wide (a 7x7 plane is 16 tiles), and enough output work for the
    transforms to be a small part. Images transformed together (:func:`winograd_blocks`) count
    as one wider image: ResNet-50's 7x7 convs, 512 channels to 512, take 2.35 ms per image at
    batch 4 by groups of 4 images against 2.80 by one GEMM (one core)."""

    min_channels: int = 16
    min_pixels: int = 12 * 12  # output pixels of the images transformed together
    min_work: int = 64 * 13 * 13  # output channels x output pixels of one image
    # Outputs at least this wide and high take 4x4 tiles (``winograd4.py``), others 2x2.
    f4_min_side: int = 28

    def tile(self, channels: int, outputs: int, out_hw: tuple[int, int], group: int = 1) -> int:
        """The output tile's side (2 or 4) for such a conv, with ``group`` images transformed
        together, or 0 where GEMM is faster."""
        pixels = out_hw[0] * out_hw[1]
        if (
            channels < self.min_channels
            or group * pixels < self.min_pixels
            or outputs * pixels < self.min_work
        ):
            return 0
        return 4 if min(out_hw) >= self.f4_min_side else 2


def winograd_weights(w: np.ndarray) -> np.ndarray:
    """Filters (M, C, 3, 3) as their transforms, one (M, C) matrix per tile element: (16, M, C),
    computed in float64."""
    u = np.einsum("ai,mcij,bj->abmc", _G, np.asarray(w, np.float64), _G)
    return np.ascontiguousarray(u.reshape(16, w.shape[0], w.shape[1]), np.float32)


def winograd_blocks(
    out_hw: tuple[int, int],
    side: int,
    images: int,
    block_tiles: int = BLOCK_TILES,
    group_tiles: int = GROUP_TILES,
) -> tuple[int, int]:
    """Tile rows per block, and images per group, for a batch of ``images`` outputs of
    ``out_hw`` pixels in tiles of ``side`` x ``side``. A block aims at ``block_tiles`` tiles.
    Where one image has fewer than ``group_tiles``, just enough images to reach that many are
    transformed together as a group, their rows of tiles one image after another: GEMMs that
    narrow run at a fraction of their speed (most where their weights are large, which
    OpenBLAS packs once per call), and wider ones over more images only add to the transformed
    tiles' footprint. 4x4 tiles group to half as many: each transforms to 36 elements, not 16.
    Measured at batch 4 on one core, ms per image against one image at a time:

    ============================  ===========  ============
    conv, tiles                   one by one   grouped
    ============================  ===========  ============
    512 -> 512, 7x7, 2x2 tiles    2.99         2.35 (4)
    512 -> 512, 14x14, 2x2        6.9-7.3      6.0-6.1 (2)
    128 -> 32, 14x14, 4x4         0.154        0.143 (4)
    128 -> 128, 28x28, 4x4        0.86         0.91-0.96 (2)
    ============================  ===========  ============
    """
    tiles_h, pitch = -(-out_hw[0] // side), -(-out_hw[1] // side) + 1
    wanted = -(-block_tiles // pitch)
    target = group_tiles if side == 2 else group_tiles // 2
    group = max(1, min(images, wanted // tiles_h, -(-target // (tiles_h * pitch))))
    return max(1, min(group * tiles_h, wanted)), group


@njit(nogil=True, cache=True)
def fill_phases(x, phases, pad_h, pad_w, pitch, step):
    """Copy one channel ``x`` (H, W), zero-padded by ``pad_h``/``pad_w`` before, into its
    ``step * step`` phase planes ``phases[step * (row % step) + column % step]`` (flattened rows
    of ``pitch``). Pixels that no tile reads are left out; the rest of the planes stays zero."""
    rows = phases.shape[1] // pitch
    height, width = x.shape
    if (step == 2 or step == 4) and width % step == 0 and x.flags.c_contiguous and phases.flags.c_contiguous:
        _fill_by_column_phases(x, phases, pad_h, pad_w, pitch, step)
        return
    for ih in range(height):
        r = ih + pad_h
        if r >= step * rows:
            break
        src = x[ih]
        start = (r // step) * pitch
        for parity in range(step):
            dst = phases[step * (r % step) + parity, start : start + pitch]
            # columns whose pixel step * col + parity - pad_w lies inside the row: one plain
            # strided loop, which the compiler vectorizes (a test and a break in it would not)
            first = max(0, -(-(pad_w - parity) // step))
            end = min(pitch, (width - 1 - parity + pad_w) // step + 1)
            shift = parity - pad_w
            for col in range(first, end):
                dst[col] = src[step * col + shift]


@njit(nogil=True, cache=True)
def _fill_by_column_phases(x, phases, pad_h, pad_w, pitch, step):
    """:func:`fill_phases` for a contiguous ``x`` whose width is a multiple of ``step`` (2 or 4).
    A plane's row is only ``width / step`` long, too short for the compiler's vector loops, so
    the strided reads are done first over the whole channel at once: one loop splits ``x``'s
    columns by column % ``step`` into ``parts`` (a pixel's padded column then has one phase
    per part), then each row of each part is a unit-stride copy into its plane. Twice as fast
    as reading every plane's row with a stride (56x56, step 4: 1.5 against 3.1 ns per pixel)."""
    rows = phases.shape[1] // pitch
    height, width = x.shape
    per = width // step
    parts = np.empty((step, height * per), np.float32)
    src = x.reshape(-1)
    if step == 4:
        for k in range(height * per):
            parts[0, k] = src[4 * k]
            parts[1, k] = src[4 * k + 1]
            parts[2, k] = src[4 * k + 2]
            parts[3, k] = src[4 * k + 3]
    else:
        for k in range(height * per):
            parts[0, k] = src[2 * k]
            parts[1, k] = src[2 * k + 1]
    flat, part_flat = phases.reshape(-1), parts.reshape(-1)
    plane = phases.shape[1]
    for ih in range(min(height, step * rows - pad_h)):
        r = ih + pad_h
        start = (r // step) * pitch
        for q in range(step):
            # x's column step * k + q is padded column step * (k + shift) + parity
            shift, parity = (q + pad_w) // step, (q + pad_w) % step
            dst = np.uint64((step * (r % step) + parity) * plane + start + shift)
            read = np.uint64(q * height * per + ih * per)
            for k in range(np.uint64(max(0, min(per, pitch - shift)))):
                flat[dst + k] = part_flat[read + k]


@njit(nogil=True, cache=True)
def input_transform2(phases, start, pitch, v, at, n):
    """``v[e, at + t] = (Bt d B)[e]`` for the ``n`` tiles from flat tile ``start`` on (tile rows
    of ``pitch``) of one channel's phase planes, with
    Bt = [[1, 0, -1, 0], [0, 1, 1, 0], [0, -1, 1, 0], [0, 1, 0, -1]]."""
    # d[i][j] of the run of tiles: phase plane (i % 2, j % 2) from tile (i // 2, j // 2) on.
    a, b = start, start + pitch
    e00, e01, e02, e03 = (
        phases[0, a : a + n],
        phases[1, a : a + n],
        phases[0, a + 1 : a + 1 + n],
        phases[1, a + 1 : a + 1 + n],
    )
    e10, e11, e12, e13 = (
        phases[2, a : a + n],
        phases[3, a : a + n],
        phases[2, a + 1 : a + 1 + n],
        phases[3, a + 1 : a + 1 + n],
    )
    e20, e21, e22, e23 = (
        phases[0, b : b + n],
        phases[1, b : b + n],
        phases[0, b + 1 : b + 1 + n],
        phases[1, b + 1 : b + 1 + n],
    )
    e30, e31, e32, e33 = (
        phases[2, b : b + n],
        phases[3, b : b + n],
        phases[2, b + 1 : b + 1 + n],
        phases[3, b + 1 : b + 1 + n],
    )
    # Whole-array indexing keeps each view contiguous (to numba, and so to LLVM's vectorizer).
    b = at + n
    v0, v1, v2, v3 = v[0, at:b], v[1, at:b], v[2, at:b], v[3, at:b]
    v4, v5, v6, v7 = v[4, at:b], v[5, at:b], v[6, at:b], v[7, at:b]
    v8, v9, v10, v11 = v[8, at:b], v[9, at:b], v[10, at:b], v[11, at:b]
    v12, v13, v14, v15 = v[12, at:b], v[13, at:b], v[14, at:b], v[15, at:b]
    for t in range(n):
        d20, d21, d22, d23 = e20[t], e21[t], e22[t], e23[t]
        r00, r01, r02, r03 = e00[t] - d20, e01[t] - d21, e02[t] - d22, e03[t] - d23
        d10, d11, d12, d13 = e10[t], e11[t], e12[t], e13[t]
        r10, r11, r12, r13 = d10 + d20, d11 + d21, d12 + d22, d13 + d23
        r20, r21, r22, r23 = d20 - d10, d21 - d11, d22 - d12, d23 - d13
        r30, r31, r32, r33 = d10 - e30[t], d11 - e31[t], d12 - e32[t], d13 - e33[t]
        v0[t], v1[t], v2[t], v3[t] = r00 - r02, r01 + r02, r02 - r01, r01 - r03
        v4[t], v5[t], v6[t], v7[t] = r10 - r12, r11 + r12, r12 - r11, r11 - r13
        v8[t], v9[t], v10[t], v11[t] = r20 - r22, r21 + r22, r22 - r21, r21 - r23
        v12[t], v13[t], v14[t], v15[t] = r30 - r32, r31 + r32, r32 - r31, r31 - r33


@njit(nogil=True, cache=True)
def output_transform2(m, at, y, n):
    """``y[2 * a + b, t] = (At m A)[a, b]`` from ``m[e, at + t]`` (one output channel's ``n``
    transformed tiles), with At = [[1, 1, 1, 0], [0, 1, -1, -1]]."""
    b = at + n
    m0, m1, m2, m3 = m[0, at:b], m[1, at:b], m[2, at:b], m[3, at:b]
    m4, m5, m6, m7 = m[4, at:b], m[5, at:b], m[6, at:b], m[7, at:b]
    m8, m9, m10, m11 = m[8, at:b], m[9, at:b], m[10, at:b], m[11, at:b]
    m12, m13, m14, m15 = m[12, at:b], m[13, at:b], m[14, at:b], m[15, at:b]
    y0, y1, y2, y3 = y[0, :n], y[1, :n], y[2, :n], y[3, :n]
    for t in range(n):
        w1, w2, w5, w6, w9, w10 = m1[t], m2[t], m5[t], m6[t], m9[t], m10[t]
        s0 = m0[t] + m4[t] + m8[t]
        s1 = w1 + w5 + w9
        s2 = w2 + w6 + w10
        s3 = m3[t] + m7[t] + m11[t]
        u0 = m4[t] - m8[t] - m12[t]
        u1 = w5 - w9 - m13[t]
        u2 = w6 - w10 - m14[t]
        u3 = m7[t] - m11[t] - m15[t]
        y0[t] = s0 + s1 + s2
        y1[t] = s1 - s2 - s3
        y2[t] = u0 + u1 + u2
        y3[t] = u1 - u2 - u3


@njit(inline="always", nogil=True, cache=True)
def spread(floats):
    """``floats`` rounded up to 64 past a multiple of 1024: rows of that many float32 start
    256 bytes further along the cache's sets each, so that the sixteen rows a transform walks
    together do not evict each other (rows a multiple of 4 KiB apart share the same sets)."""
    return floats if floats < 1024 else floats + (64 - floats) % 1024


@njit(inline="always", nogil=True, cache=True)
def interleave2(dst, y, row, q):
    """``dst[2t + b] = y[row + b, q + t]`` as far as ``dst`` reaches."""
    half = dst.shape[0] // 2
    even, odd = y[row, q : q + half + 1], y[row + 1, q : q + half + 1]
    for t in range(half):
        dst[2 * t] = even[t]
        dst[2 * t + 1] = odd[t]
    if dst.shape[0] % 2:
        dst[2 * half] = even[half]
