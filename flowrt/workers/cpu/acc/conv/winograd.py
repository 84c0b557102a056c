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

from flowrt.workers.cpu.acc.calls import NATIVE
from flowrt.workers.cpu.acc.kernels.pool_vectors import copy_floats, interleave2_vector
from flowrt.workers.cpu.acc.tile_ir import LANES

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
    # Outputs at least this wide and high take 4x4 tiles (``winograd4.py``) where fast math
    # allows them, others 2x2. F(4x4, 3x3) runs ResNet-18 8% faster (two Zen 5 cores) but
    # its errors are about 20x im2col and GEMM's (5e-6 of the output's magnitude on ResNet's
    # 3x3 convs, 64 to 512 channels; GEMM, F(2x2, 3x3) and ONNX Runtime 2-3e-7): it is
    # taken only with ``OptimizerOptions(fast_math=True)``.
    f4_min_side: int = 28

    def tile(
        self, channels: int, outputs: int, out_hw: tuple[int, int], group: int = 1, fast_math: bool = False
    ) -> int:
        """The output tile's side (2 or 4) for such a conv, with ``group`` images transformed
        together, or 0 where GEMM is faster; 4 only with ``fast_math``."""
        pixels = out_hw[0] * out_hw[1]
        if (
            channels < self.min_channels
            or group * pixels < self.min_pixels
            or outputs * pixels < self.min_work
        ):
            return 0
        return 4 if fast_math and min(out_hw) >= self.f4_min_side else 2


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


# The kernels below index flat float32 arrays by unsigned offsets: a view or a slice costs
# numba as much to compile as a loop (a 2-D reshape five times that), and the four transforms
# of the two tile sizes took 4 s of a cold cache as sixteen to seventy-two views each. In the
# loops, unsigned indices also spare LLVM numba's wrap-around of negative ones.
# The transforms are called by address (``winograd_conv``): nothing calls them from Python.


@njit(**NATIVE)
def fill_phases4(x, at, height, width, phases, base, size, pad_h, pad_w, pitch, parts):
    """Copy one channel, the (``height``, ``width``) plane at flat ``x[at:]`` (``width`` a
    multiple of 4), zero-padded by ``pad_h``/``pad_w`` before, into its 16 phase planes: plane
    ``4 * (row % 4) + column % 4`` at ``phases[base + plane * size:]``, flattened rows of
    ``pitch``, ``size // pitch`` of them. Pixels that no tile reads are left out; the rest of
    the planes stays zero. ``parts``: scratch of ``height * width`` floats. (Other planes are
    split by ``phases.fill_phase_planes``, which reads pairs of floats at stride 2.)

    A plane's row is only width / 4 long, too short for the compiler's vector loops, so the
    strided reads are done first over the whole channel at once: one loop splits x's columns
    by column % 4 into ``parts`` (a pixel's padded column then has one phase per part), then
    each row of each part is a unit-stride copy into its plane. Twice as fast as reading
    every plane's row with a stride (56x56: 1.5 against 3.1 ns per pixel)."""
    rows = size // pitch
    u8 = np.uint64
    per = width // 4
    count = height * per
    src, n = u8(at), u8(count)
    for k in range(n):
        w = src + u8(4) * k
        parts[k] = x[w]
        parts[n + k] = x[w + u8(1)]
        parts[u8(2) * n + k] = x[w + u8(2)]
        parts[u8(3) * n + k] = x[w + u8(3)]
    step = parts.shape[0] // count  # 4, unknown to LLVM: unrolling these loops by four
    # quadrupled the code to compile, for no speed
    # Divisions by 4 as shifts and masks: by the unknown step, each was an integer division.
    # With the runs copied as masked vectors (below), 64 channels at 56x56 fill in 49 us, 97
    # before; 128 at 28x28 in 48, 77 before (one Zen 5 core).
    for ih in range(min(height, step * rows - pad_h)):
        r = ih + pad_h
        start = base + (r >> 2) * pitch
        for q in range(step):
            # x's column 4 * k + q is padded column 4 * (k + shift) + parity
            shift, parity = (q + pad_w) >> 2, (q + pad_w) & 3
            dst = (4 * (r & 3) + parity) * size + start + shift
            read = q * count + ih * per
            # a vector at a time, the last masked: a run is short (14 cells at 56x56), and
            # LLVM's vector loop takes 64 a turn, leaving such a run to its scalar loop
            run = max(0, min(per, pitch - shift))
            for k in range(0, run, LANES):
                copy_floats(phases, dst + k, parts, read + k, min(LANES, run - k))


@njit(**NATIVE)
def input_transform2(phases, base, size, start, pitch, tmp, v, vrow, at, n):
    """``v[e * vrow + at + t] = (Bt d B)[e]`` for the ``n`` tiles from flat tile ``start`` on
    (tile rows of ``pitch``) of the channel whose phase planes are ``phases[base:]``, ``size``
    apart, with Bt = [[1, 0, -1, 0], [0, 1, 1, 0], [0, -1, 1, 0], [0, 1, 0, -1]] (``tmp``:
    unused, as F(4x4)'s takes it)."""
    u8 = np.uint64
    s, one, r = u8(size), u8(1), u8(vrow)
    # d[i][j] of the run of tiles: phase plane (i % 2, j % 2) from tile (i // 2, j // 2) on.
    a = u8(base + start)
    b = a + u8(pitch)
    a0, a1, a2, a3 = a, a + s, a + u8(2) * s, a + u8(3) * s
    b0, b1, b2, b3 = b, b + s, b + u8(2) * s, b + u8(3) * s
    for t in range(u8(n)):
        d20, d21, d22, d23 = phases[b0 + t], phases[b1 + t], phases[b0 + one + t], phases[b1 + one + t]
        r00, r01 = phases[a0 + t] - d20, phases[a1 + t] - d21
        r02, r03 = phases[a0 + one + t] - d22, phases[a1 + one + t] - d23
        d10, d11, d12, d13 = phases[a2 + t], phases[a3 + t], phases[a2 + one + t], phases[a3 + one + t]
        r10, r11, r12, r13 = d10 + d20, d11 + d21, d12 + d22, d13 + d23
        r20, r21, r22, r23 = d20 - d10, d21 - d11, d22 - d12, d23 - d13
        r30, r31 = d10 - phases[b2 + t], d11 - phases[b3 + t]
        r32, r33 = d12 - phases[b2 + one + t], d13 - phases[b3 + one + t]
        o = u8(at) + t
        v[o] = r00 - r02
        v[o + r] = r01 + r02
        v[o + u8(2) * r] = r02 - r01
        v[o + u8(3) * r] = r01 - r03
        v[o + u8(4) * r] = r10 - r12
        v[o + u8(5) * r] = r11 + r12
        v[o + u8(6) * r] = r12 - r11
        v[o + u8(7) * r] = r11 - r13
        v[o + u8(8) * r] = r20 - r22
        v[o + u8(9) * r] = r21 + r22
        v[o + u8(10) * r] = r22 - r21
        v[o + u8(11) * r] = r21 - r23
        v[o + u8(12) * r] = r30 - r32
        v[o + u8(13) * r] = r31 + r32
        v[o + u8(14) * r] = r32 - r31
        v[o + u8(15) * r] = r31 - r33


@njit(**NATIVE)
def output_transform2(m, mrow, at, tmp, y, yrow, n):
    """``y[(2 * a + b) * yrow + t] = (At m A)[a, b]`` from ``m[e * mrow + at + t]`` (one
    output channel's ``n`` transformed tiles), with At = [[1, 1, 1, 0], [0, 1, -1, -1]]
    (``tmp``: unused, as F(4x4)'s takes it)."""
    u8 = np.uint64
    r, w = u8(mrow), u8(yrow)
    for t in range(u8(n)):
        o = u8(at) + t
        m0, m1, m2, m3 = m[o], m[o + r], m[o + u8(2) * r], m[o + u8(3) * r]
        m4, m5, m6, m7 = m[o + u8(4) * r], m[o + u8(5) * r], m[o + u8(6) * r], m[o + u8(7) * r]
        m8, m9, m10, m11 = m[o + u8(8) * r], m[o + u8(9) * r], m[o + u8(10) * r], m[o + u8(11) * r]
        m12, m13 = m[o + u8(12) * r], m[o + u8(13) * r]
        m14, m15 = m[o + u8(14) * r], m[o + u8(15) * r]
        s0 = m0 + m4 + m8
        s1 = m1 + m5 + m9
        s2 = m2 + m6 + m10
        s3 = m3 + m7 + m11
        u0 = m4 - m8 - m12
        u1 = m5 - m9 - m13
        u2 = m6 - m10 - m14
        u3 = m7 - m11 - m15
        y[t] = s0 + s1 + s2
        y[w + t] = s1 - s2 - s3
        y[u8(2) * w + t] = u0 + u1 + u2
        y[u8(3) * w + t] = u1 - u2 - u3


@njit(inline="always", nogil=True, cache=True)
def spread(floats):
    """``floats`` rounded up to 64 past a multiple of 1024: rows of that many float32 start
    256 bytes further along the cache's sets each, so that the sixteen rows a transform walks
    together do not evict each other (rows a multiple of 4 KiB apart share the same sets)."""
    return floats if floats < 1024 else floats + (64 - floats) % 1024


@njit(**NATIVE)
def interleave2(dst, at, width, y, even, odd):
    """``dst[at + 2t + b] = y[(even, odd)[b] + t]`` for the ``width`` outputs of a row
    (``odd`` past ``even``), ``2 * LANES`` at a time as shuffled vectors: a row is short (14
    outputs at 14x14), and a loop left it to LLVM's scalar loop (256 channels at 14x14: 91 us
    of the conv's 740)."""
    for t in range(0, width, 2 * LANES):
        interleave2_vector(dst, at + t, y, even + t // 2, odd - even, min(2 * LANES, width - t))
