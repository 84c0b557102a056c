"""The knobs of CpuAcc's conv algorithms: how each shape is split and which algorithm takes it.

:class:`ConvTuning` holds them, frozen; ``ConvKernel`` is given one (the default unless a test
builds another with ``attrs.evolve`` to force a path) and passes it to every algorithm's
``applies`` and ``plan``.
"""

from __future__ import annotations

import attrs

from flowrt.engine.scheduler.window import SplitHint
from flowrt.workers.cpu.acc.conv.winograd import BLOCK_TILES, GROUP_TILES, WinogradRule
from flowrt.workers.cpu.acc.tile_ir import AVAILABLE as TILES_AVAILABLE
from flowrt.workers.cpu.acc.tile_ir import TILE_COLUMNS

# Fewest output pixels a slice should have: below it BLAS runs narrow and the channels are split.
MIN_COLUMNS = 96
# Fewest output channels per slice when the channels are split.
MIN_ROWS = 16
# The column buffer a chunk fills is kept near this many floats, so that it stays in L2.
CHUNK_FLOATS = 512 * 1024
# Most output channels (per group) for which a stride-1 conv runs one GEMM per kernel tap.
TAPS_MAX_ROWS = 32
# The output block a tap-by-tap slice accumulates into is kept near this many floats.
TAPS_BLOCK_FLOATS = 16 * 1024
# Most weights (floats per group) for which the column path multiplies by register tiles
# (``tiles.py``) instead of BLAS: each block of columns reads every panel of weights again,
# and past a few megabytes they come from L3 (512x4608, VGG's last convs: 0.93x BLAS).
TILES_MAX_WEIGHTS = 1 << 20
# Longest dot product (C / groups * kh * kw) the register tiles take: each tile sums over the
# whole depth, where BLAS blocks it. AVX2's 6x16 tiles lose to OpenBLAS past about 192 (on one
# core of an AMD EPYC without AVX-512, a 1x1 conv of K=256 ran 1.06-1.68x BLAS's time and
# one of K=512 1.11-1.49x, from 7x7 to 56x56 pixels; one of K<=96 0.71-1.03x; a 3x3 im2col
# GEMM of K=144 0.69x, of K=576 and 1152 1.17x and 1.24x). AVX-512's 8x32 tiles were measured
# ahead of BLAS at every depth on a Zen 4 core, and keep no limit.
TILES_MAX_DEPTH = 192 if TILE_COLUMNS == 16 else 1 << 30
# Most output pixels per image for which a 1x1 conv runs by tiles across its output channels
# (``few_pixels.py``) rather than across its pixels; and the most where its depth would leave
# it to BLAS. On one core of an AMD EPYC without AVX-512, in MobileNetV2: 7x7 convs 8-35%
# faster than by the column tiles or BLAS, 14x14 ones of depth 384 and 576 5-20% faster than
# BLAS, 14x14 ones of depth 64 and 96 5-10% slower than the column tiles; a batch of 2 or 4
# 7x7 images (160 -> 960 channels) twice as fast as the column tiles over the merged batch.
FEW_PIXELS_MAX = 64
FEW_PIXELS_DEEP_MAX = 196
# A batch runs as one GEMM when each image has at most MERGE_PIXELS output pixels and the
# layer's weights (per group) are at least MERGE_WEIGHTS floats: with fewer, they stay in L2
# from one image to the next, and the copies cost more than the wider GEMM saves (measured on
# the 14x14 and 13x13 layers of inception_v2 and squeezenet, where 1x1 convs of 32K-55K weights
# ran 10-20% slower merged, those of 256K-2M weights 5-10% faster).
MERGE_PIXELS = 256
MERGE_WEIGHTS = 1 << 18
# Longest dot product (C / groups * kh * kw) of a strided conv read from its phase planes by
# the tiles (``windows.py``): one block of k (its ``DEPTH_MAX``). The stems and few channels:
# a stem of 3 -> 16 channels at 224x224 took 125 us by columns, 91 by windows (one Zen 5
# core); deeper ones (128 -> 128, 3x3 at 56x56: 1.22 against 1.31 ms alone, slower in
# ResNet-50 on two cores) gained nothing sure.
WINDOWS_MAX_DEPTH = 192
# Most output pixels per plane of a 3x3 or 5x5 depthwise conv (unit or 2 strides, "same"
# pads) computed by explicit vectors (``depthwise_taps.py``): a plane's outputs are few vectors
# there, which LLVM's vectorized loops ran mostly one value at a time. One Zen 5 core, planes
# of the mobile nets: 3x3 at stride 1, 7x7 29 -> 22 us for 960 planes, 14x14 15 -> 13.5 for
# 240; at stride 2, 14x14 -> 7x7 67 -> 35 us for 576 planes, 5x5 28x28 -> 14x14 73 -> 48 for
# 240; at 28x28 and past, the loops' time or less (the planes' copies in and out cost as much
# as the taps there).
DEPTHWISE_VECTOR_MAX = 196


@attrs.frozen
class ConvTuning:
    """How CpuAcc's convs split their work and choose their algorithm (see each field)."""

    # The split over output pixels (columns), and over output channels (rows).
    column_hint: SplitHint = SplitHint(axis=2, min_slice=MIN_COLUMNS)
    row_hint: SplitHint = SplitHint(axis=1, min_slice=MIN_ROWS)
    chunk_floats: int = CHUNK_FLOATS
    merge_pixels: int = MERGE_PIXELS
    merge_weights: int = MERGE_WEIGHTS
    taps_max_rows: int = TAPS_MAX_ROWS
    taps_block_floats: int = TAPS_BLOCK_FLOATS
    winograd_rule: WinogradRule = WinogradRule()
    winograd_block_tiles: int = BLOCK_TILES
    winograd_group_tiles: int = GROUP_TILES
    # -1 on CPUs without the register tiles (no AVX2): the column paths multiply by BLAS.
    tiles_max_weights: int = TILES_MAX_WEIGHTS if TILES_AVAILABLE else -1
    tiles_max_depth: int = TILES_MAX_DEPTH
    few_pixels_max: int = FEW_PIXELS_MAX
    few_pixels_deep_max: int = FEW_PIXELS_DEEP_MAX
    windows_max_depth: int = WINDOWS_MAX_DEPTH
    depthwise_vector_max: int = DEPTHWISE_VECTOR_MAX
    # Whether less exact algorithms may take a shape (the network's ``fast_math`` option):
    # Winograd's 4x4 output tiles (``WinogradRule``).
    fast_math: bool = False

    def tiles(self, group_weights: int, depth: int) -> bool:
        """Whether a GEMM of ``group_weights`` weights and dot products ``depth`` long runs by
        the register tiles (else BLAS)."""
        return group_weights <= self.tiles_max_weights and depth <= self.tiles_max_depth
