"""Conv (2-D, NCHW) as im2col and GEMM, with bias and the fused activation applied in cache.

The window is the output's pixels (columns of the GEMM). Each slice walks its columns in
chunks: it copies the chunk's input windows into a column buffer of its own (im2col) and
multiplies the weights by it straight into the output block, with bias and activation applied as
the block is stored: by register tiles over weights packed at load (``tiles.py``), or by BLAS
for weights past ``TILES_MAX_WEIGHTS`` and on CPUs without AVX2. A 1x1 stride-1 unpadded conv
reads its input as the column matrix itself, and a strided conv copies its columns from the
phase planes of each image, split once (``im2col.im2col_phases``). When there are too few
pixels to give every worker a slice, the output channels (GEMM rows) are split instead, over
one shared column matrix. Those two kernels are in ``conv_columns.py``; this file plans which
path a shape takes and how it is split.

A stride-1 conv with few output channels skips the column matrix and runs one GEMM per kernel
tap (``taps.py``). A batch of small images through large weights runs as one GEMM over all
the images' column matrices (``conv_batched.py``).

Depthwise conv (one input channel per group) is a direct loop, one slice per channel
(``depthwise.py``); a 3x3 stride-1 conv with enough channels and pixels runs by Winograd's
F(2x2, 3x3) (``winograd.py``).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from flowrt.engine.graph.layers.conv import window_geometry
from flowrt.engine.scheduler.window import SplitHint, split_bounds
from flowrt.registry import Support, WorkloadInfo
from flowrt.types import DataType
from flowrt.workers.cpu.acc.blas import pin_scipy_blas, read_only
from flowrt.workers.cpu.acc.kernels import acc_kernel
from flowrt.workers.cpu.acc.kernels.conv_batched import MERGE_PIXELS, MERGE_WEIGHTS, conv_batched
from flowrt.workers.cpu.acc.kernels.conv_columns import conv_by_columns, conv_by_rows
from flowrt.workers.cpu.acc.kernels.conv_packed import conv_packed
from flowrt.workers.cpu.acc.kernels.depthwise import depthwise, depthwise_same3
from flowrt.workers.cpu.acc.kernels.epilogue import NONE, activation_args
from flowrt.workers.cpu.acc.kernels.grouped import MAX_GROUP_CHANNELS, grouped_direct
from flowrt.workers.cpu.acc.kernels.taps import conv_by_taps
from flowrt.workers.cpu.acc.kernels.winograd import (
    BLOCK_TILES,
    GROUP_TILES,
    WinogradRule,
    winograd_blocks,
    winograd_weights,
)
from flowrt.workers.cpu.acc.kernels.winograd4 import winograd4_weights
from flowrt.workers.cpu.acc.kernels.winograd_conv import winograd_conv
from flowrt.workers.cpu.acc.tiles import AVAILABLE as TILES_AVAILABLE
from flowrt.workers.cpu.acc.tiles import TILE_COLUMNS, pack_panels, pad_rows
from flowrt.workers.cpu.workers import job_threads

pin_scipy_blas()

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
# What conv_by_columns is passed for its panels when it multiplies by BLAS.
_NO_PANELS = np.empty((0, 0, 0, 0), np.float32)
_NO_BIAS = np.empty((0, 0), np.float32)


def _balance(tasks: int, workers: int) -> float:
    """How busy ``workers`` are kept by ``tasks`` equal tasks (1: all of them, all the time)."""
    return tasks / (workers * -(-tasks // workers))


class _Plan(NamedTuple):
    """How one input shape runs: geometry, output shape, and the split."""

    geo: np.ndarray  # kh, kw, sh, sw, dh, dw, ph, pw, oh, ow
    out_shape: tuple[int, ...]
    direct: bool  # 1x1, stride 1, no padding: the input is the column matrix
    column_bounds: np.ndarray | None  # split over pixels, or None to split over channels
    batched_bounds: np.ndarray | None  # a batch as one GEMM: split over all images' pixels
    packed_bounds: np.ndarray | None  # 1x1 by tiles, all images' pixels side by side
    row_bounds: np.ndarray
    chunk: int
    tile_chunk: int  # chunk when multiplying by register tiles: whole tiles of columns
    tiles: bool  # the column paths multiply by register tiles (else BLAS)
    plane_bounds: np.ndarray  # depthwise: (image, channel) planes per slice
    same3: bool  # depthwise 3x3, unit stride, one pad cell per side, planes >= 2x2
    taps: bool  # run by conv_by_taps (taps.py)
    padded_shape: np.ndarray  # tap by tap: the padded plane's rows and pitch
    block_rows: int  # tap by tap: output rows per block
    tap_row_bounds: np.ndarray  # tap by tap: output rows per slice
    winograd: int  # the Winograd output tile's side (2: F(2x2, 3x3), 4: F(4x4, 3x3)), or 0
    tile_bounds: np.ndarray  # Winograd: rows of output tiles per slice (a group's images' rows)
    tile_block: int  # Winograd: tile rows per block
    tile_group: int  # Winograd: images transformed together
    phase_shape: np.ndarray  # strided, by columns: rows and pitch of the phase planes (else zeros)
    group_bounds: np.ndarray | None  # few channels per group: (image, group) tasks per slice


@acc_kernel("Conv")
class ConvKernel:
    """2-D float32 Conv with groups, strides, dilations, pads and auto_pad; bias and the fused
    activation are applied as each output block is written."""

    split_hint = SplitHint(axis=2, min_slice=MIN_COLUMNS)  # output pixels, (N, M, pixels)

    @classmethod
    def supports(cls, info: WorkloadInfo) -> Support:
        x, w = info.inputs[0], info.inputs[1]
        if any(t is not None and t.dtype is not DataType.FLOAT32 for t in info.inputs):
            return Support.no("CpuAcc Conv takes float32 only")
        ranks = {len(t.shape) for t in (x, w) if t is not None and t.shape is not None}
        if ranks != {4}:
            found = "unknown" if not ranks else " and ".join(str(r - 2) for r in sorted(ranks))
            return Support.no(f"CpuAcc Conv takes 2-D spatial data (rank 4) only, got {found}-D")
        return Support.yes()

    def __init__(self, info: WorkloadInfo, workers: int) -> None:
        self.info = info
        self.workers = workers
        self.desc = info.descriptor
        self.code, self.alpha, self.beta = activation_args(info.activation)
        constants = tuple(info.constants) + (None,) * 3
        self.weights = None if constants[1] is None else self._pack(constants[1])
        self.weights_shape = None if constants[1] is None else tuple(constants[1].shape)
        self.bias = None if constants[2] is None else np.ascontiguousarray(constants[2], np.float32)
        # The split, chunking and path knobs, per instance so that tests can force each case.
        self.row_hint = SplitHint(axis=1, min_slice=MIN_ROWS)
        self.chunk_floats = CHUNK_FLOATS
        self.merge_pixels = MERGE_PIXELS
        self.merge_weights = MERGE_WEIGHTS
        self.taps_max_rows = TAPS_MAX_ROWS
        self.taps_block_floats = TAPS_BLOCK_FLOATS
        self.winograd_rule = WinogradRule()
        self.tiles_max_weights = TILES_MAX_WEIGHTS if TILES_AVAILABLE else -1
        self._panels: tuple[np.ndarray, np.ndarray] | None = None
        self.winograd_block_tiles = BLOCK_TILES
        self.winograd_group_tiles = GROUP_TILES
        self._taps: np.ndarray | None = None
        self._winograd: dict[int, np.ndarray] = {}
        self._plans: dict[tuple[int, ...], _Plan] = {}

    def _pack(self, w: np.ndarray) -> np.ndarray:
        """Weights as (group, M/group, C/group * kh * kw) float32, the GEMM's left operand."""
        group = self.desc.group
        return read_only(np.ascontiguousarray(w, np.float32).reshape(group, w.shape[0] // group, -1))

    def _tap_weights(self, w: np.ndarray, w_shape: tuple[int, ...]) -> np.ndarray:
        """Packed weights (1, M, C*kh*kw) as one (M, C) matrix per kernel tap: (kh*kw, M, C);
        kept for constant weights."""
        if self._taps is not None and w is self.weights:
            return self._taps
        m, c, kh, kw = w_shape
        taps = read_only(np.ascontiguousarray(w.reshape(m, c, kh * kw).transpose(2, 0, 1)))
        if w is self.weights:
            self._taps = taps
        return taps

    def _winograd_weights(self, w: np.ndarray, w_shape: tuple[int, ...], tile: int) -> np.ndarray:
        """The filters' Winograd transforms for ``tile`` x ``tile`` outputs ((tile + 2)^2, M, C);
        kept for constant weights."""
        if w is self.weights and tile in self._winograd:
            return self._winograd[tile]
        u = read_only((winograd_weights if tile == 2 else winograd4_weights)(w.reshape(w_shape)))
        if w is self.weights:
            self._winograd[tile] = u
        return u

    def _tile_panels(self, w: np.ndarray, bias: np.ndarray, constant: bool) -> tuple[np.ndarray, np.ndarray]:
        """Packed weights ``w`` as register-tile panels per group, and the bias padded to
        match (``tiles.py``); kept when both are ``constant``."""
        if constant and self._panels is not None:
            return self._panels
        groups, mg = w.shape[0], w.shape[1]
        panels = np.stack([pack_panels(w[g]) for g in range(groups)])
        padded = np.stack([pad_rows(bias[g * mg : (g + 1) * mg]) for g in range(groups)])
        if constant:
            self._panels = (panels, padded)
        return panels, padded

    def plan(self, x_shape: tuple[int, ...], w_shape: tuple[int, ...], workers: int | None = None) -> _Plan:
        """The geometry and split for one input shape over ``workers`` (default: the kernel's),
        computed once per shape and worker count."""
        workers = self.workers if workers is None else workers
        key = (*x_shape, *w_shape, workers)
        cached = self._plans.get(key)
        if cached is not None:
            return cached
        kernel = w_shape[2:]
        g = window_geometry(self.desc, x_shape[2:], kernel)
        geo = np.array([*kernel, *g.strides, *g.dilations, *g.pads_begin, *g.out], np.int64)
        direct = kernel == (1, 1) and g.strides == (1, 1) and not any(g.pads_begin + g.pads_end)
        groups, mg = self.desc.group, w_shape[0] // self.desc.group
        pixels, rows = int(g.out[0]) * int(g.out[1]), w_shape[1] * kernel[0] * kernel[1]
        column_bounds = split_bounds(pixels, self.split_hint, workers)
        row_bounds = split_bounds(mg, self.row_hint, workers)
        by_columns = _balance(groups * (len(column_bounds) - 1), workers) >= _balance(
            groups * (len(row_bounds) - 1), workers
        )
        batched_bounds = split_bounds(x_shape[0] * pixels, self.split_hint, workers)
        tiles = mg * rows <= self.tiles_max_weights
        # A 1x1 conv by register tiles reads all the images' pixels as one row of columns,
        # split over them as long as that keeps the workers as busy as a split over channels.
        packed = direct and _balance(groups * (len(batched_bounds) - 1), workers) >= _balance(
            groups * (len(row_bounds) - 1), workers
        )
        # Otherwise a batch of small images runs as one GEMM if that splits over the workers as
        # evenly. (The tiles read the images in place, where the one GEMM copies them first:
        # resnet50's 1x1 convs at 7x7 and 14x14 and squeezenet's last, at batch 4, ran 1-12%
        # faster by tiles on one thread and 16-35% on two.)
        batched = (
            x_shape[0] > 1
            and pixels <= self.merge_pixels
            and mg * rows >= self.merge_weights
            and not (packed and tiles)
            and _balance(groups * (len(batched_bounds) - 1), workers)
            >= max(_balance(groups * (len(b) - 1), workers) for b in (column_bounds, row_bounds))
        )
        chunk = max(min(MIN_COLUMNS, self.chunk_floats), self.chunk_floats // max(rows, mg))
        oh, ow = int(g.out[0]), int(g.out[1])
        taps = groups == 1 and g.strides == (1, 1) and not direct and mg <= self.taps_max_rows
        padded_shape = np.array(
            [
                max(x_shape[2] + g.pads_begin[0], oh + (kernel[0] - 1) * g.dilations[0]),
                max(x_shape[3] + g.pads_begin[1], ow + (kernel[1] - 1) * g.dilations[1]),
            ],
            np.int64,
        )
        tap_row_bounds = split_bounds(oh, SplitHint(0, 1), workers)
        block_rows = max(
            1, min(int(tap_row_bounds[1]), self.taps_block_floats // (mg * int(padded_shape[1])))
        )
        # A strided conv whose kernel spans at least its stride on both axes reads its columns
        # from phase planes (a 1x1 stride-2 conv would split four planes to read one).
        phased = g.strides != (1, 1) and all(k * d >= st for k, d, st in zip(kernel, g.dilations, g.strides))
        winograd_shaped = groups == 1 and kernel == (3, 3) and g.strides == (1, 1) and g.dilations == (1, 1)
        blocks = (x_shape[0], self.winograd_block_tiles, self.winograd_group_tiles)
        group = winograd_blocks((oh, ow), 2, *blocks)[1]  # images per group with 2x2 tiles
        winograd = self.winograd_rule.tile(w_shape[1], mg, (oh, ow), group) if winograd_shaped else 0
        tile_block, tile_group = winograd_blocks((oh, ow), max(winograd, 1), *blocks)
        cached = self._plans[key] = _Plan(
            geo,
            (x_shape[0], w_shape[0], int(g.out[0]), int(g.out[1])),
            direct,
            column_bounds if by_columns else None,
            batched_bounds if batched else None,
            batched_bounds if packed else None,
            row_bounds,
            chunk,
            max(TILE_COLUMNS, chunk - chunk % TILE_COLUMNS),
            tiles,
            split_bounds(x_shape[0] * w_shape[0], SplitHint(0, 1), workers),
            kernel == (3, 3)
            and g.strides == g.dilations == (1, 1)
            and g.pads_begin == g.pads_end == (1, 1)
            and min(x_shape[2:]) >= 2,
            taps,
            padded_shape,
            block_rows,
            tap_row_bounds,
            winograd,
            split_bounds(tile_group * -(-oh // max(winograd, 1)), SplitHint(0, 1), workers),
            tile_block,
            tile_group,
            np.array(
                [
                    oh + (kernel[0] - 1) * g.dilations[0] // g.strides[0],
                    ow + (kernel[1] - 1) * g.dilations[1] // g.strides[1],
                ]
                if phased
                else [0, 0],
                np.int64,
            ),
            split_bounds(x_shape[0] * groups, SplitHint(0, 1), workers)
            if 1 < groups < x_shape[1] and w_shape[1] <= MAX_GROUP_CHANNELS and kernel != (1, 1)
            else None,
        )
        return cached

    def execute(self, inputs, outputs=None):
        x = np.ascontiguousarray(inputs[0], np.float32)
        w = self.weights if self.weights is not None else self._pack(inputs[1])
        w_shape = self.weights_shape if self.weights is not None else tuple(inputs[1].shape)
        # as many slices as the job has threads now: a run sharing the cores with others
        # steps down to one, and one slice runs wider GEMMs than two run one after the other
        threads = job_threads()
        plan = self.plan(x.shape, w_shape, None if threads is None else min(self.workers, threads))
        out = np.empty(plan.out_shape, np.float32) if outputs is None else outputs[0]
        b = self.bias if self.bias is not None else inputs[2] if len(inputs) > 2 else None
        finish = b is not None or self.code != NONE
        bias = read_only(
            np.zeros(w_shape[0], np.float32) if b is None else np.ascontiguousarray(b, np.float32)
        )
        args = (self.code, self.alpha, self.beta)
        if self.desc.group == x.shape[1] > 1:
            filters = w.reshape(w_shape[0], *w_shape[2:])
            if plan.same3 and out.flags.c_contiguous:
                depthwise_same3(x, filters, bias, out, *args, plan.plane_bounds)
            else:
                depthwise(x, filters, bias, out, plan.geo, *args, plan.plane_bounds)
            return [out]
        if plan.group_bounds is not None:
            grouped_direct(x, w.reshape(w_shape), bias, out, plan.geo, *args, plan.group_bounds)
            return [out]
        if plan.winograd:
            u = self._winograd_weights(w, w_shape, plan.winograd)
            pads = plan.geo[6:8]
            blocks = (plan.tile_bounds, plan.tile_block, plan.tile_group)
            winograd_conv(x, u, bias, out, pads[0], pads[1], *blocks, *args, plan.winograd)
            return [out]
        if plan.taps:
            w_taps = self._tap_weights(w, w_shape)
            conv_by_taps(
                x,
                w_taps,
                bias,
                out,
                plan.geo,
                plan.padded_shape,
                plan.tap_row_bounds,
                plan.block_rows,
                finish,
                *args,
            )
            return [out]
        x_flat = x.reshape(*x.shape[:2], -1)
        out_flat = out.reshape(*out.shape[:2], -1)
        if plan.batched_bounds is not None:
            conv_batched(x, x_flat, w, bias, out_flat, plan.geo, plan.direct, plan.batched_bounds, *args)
            return [out]
        tiles = plan.tiles
        if tiles and (plan.packed_bounds is not None or plan.column_bounds is not None):
            constant = w is self.weights and (self.bias is not None or b is None)
            panels, panel_bias = self._tile_panels(w, bias, constant)
        else:
            panels, panel_bias = _NO_PANELS, _NO_BIAS
        if tiles and plan.packed_bounds is not None:
            conv_packed(x_flat, panels, panel_bias, out_flat, plan.packed_bounds, *args)
        elif plan.column_bounds is not None:
            conv_by_columns(
                x,
                x_flat,
                w,
                bias,
                out_flat,
                plan.geo,
                plan.direct,
                plan.column_bounds,
                plan.tile_chunk if tiles else plan.chunk,
                finish,
                *args,
                panels,
                panel_bias,
                plan.phase_shape,
            )
        else:
            conv_by_rows(x, x_flat, w, bias, out_flat, plan.geo, plan.direct, plan.row_bounds, finish, *args)
        return [out]
