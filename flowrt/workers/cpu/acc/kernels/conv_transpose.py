"""ConvTranspose (1-D and 2-D, NCHW): one GEMM for every kernel cell's contribution, then a
col2im that sums them phase by phase and stores each output row once, with its bias.

The GEMM multiplies the weights of every kernel cell, (M/group * kh * kw, C/group) packed at
load, by a block of the input's rows: each input pixel's contribution to each (output channel,
kernel cell), as CpuRef and Caffe's deconvolution compute it. col2im is where they differ:
with stride (sh, sw), the output cells ``(ry + sh * j, rx + sw * i)`` of one phase ``(ry, rx)``
are reached by a fixed subset of the kernel cells, each from input cell ``(j + dy, i + dx)``
at its own offset (the sub-pixel view of a transposed convolution, Shi et al. 2016). So a
phase is the sum of a few of the GEMM's rows, each shifted by its cell's offset: one run of
unit-stride adds per cell, which vectorizes, where adding each cell into the output at its
stride does not. The input's rows are padded with zero columns where a shift reaches past
them, so that a run over many rows reads zeros there and not the next row. The phases of an
output row are then interleaved into it, and the row stored once with its bias.
A U-Net's 2x2 stride-2 kernel gives each phase one cell; 4x4 stride 2, pad 1: four.

The GEMM runs on register tiles (``tiles.py``), or BLAS where those are unavailable, a chunk of
output channels at a time so that its result stays in L2. The window is the phases' rows
(``j``); a slice is a band of them in one image and group, and computes the input rows its
band reads, so slices never write the same cell (the few input rows between two bands, or two
blocks of one band, are multiplied by both). Where there are too few rows for the workers (a
1-D layer has one), each slice takes a part of the output channels as well.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np
from numba import njit

from flowrt.engine.graph.layers.conv import conv_transpose_geometry
from flowrt.engine.scheduler.job import JobContext
from flowrt.engine.scheduler.window import SplitHint, split_bounds
from flowrt.errors import BackendError
from flowrt.registry import Support, WorkloadInfo
from flowrt.types import DataType, static_dims
from flowrt.workers.cpu.acc.blas import pin_scipy_blas, sgemm
from flowrt.workers.cpu.acc.calls import NATIVE, SliceFunction
from flowrt.workers.cpu.acc.conv.tuning import TILES_MAX_WEIGHTS
from flowrt.workers.cpu.acc.kernels import acc_kernel
from flowrt.workers.cpu.acc.kernels.epilogue import NONE
from flowrt.workers.cpu.acc.tile_ir import AVAILABLE as TILES_AVAILABLE
from flowrt.workers.cpu.acc.tile_ir import TILE_ROWS
from flowrt.workers.cpu.acc.tiles import gemm_panels, pack_panels, pad_rows

pin_scipy_blas()

# Fewest multiply-adds a slice should hold: below it a second thread costs more than it saves.
MIN_SLICE_MACS = 1 << 18
# A block of input rows, which every chunk of output channels multiplies, is kept near this
# many floats: a larger block recomputes fewer rows on its edges, and stays in L3.
BLOCK_FLOATS = 1024 * 1024
# The GEMM's output for one chunk of output channels is kept near this many floats (in L2).
CHUNK_FLOATS = 256 * 1024
# What is passed for the panels when the GEMM runs on BLAS.
_NO_PANELS = np.empty((0, 0, 0, 0), np.float32)
_ZERO = np.float32(0)


@njit(nogil=True, cache=True)
def _sum_phases(cols, first, r0, r1, a0, geo, ytab, xtab, acc):
    """One output channel's phases over phase rows ``r0 .. r1``, each into its row of ``acc``
    (rows of ``pitch``, a phase row's cells from column ``left``): the sum of the GEMM's rows
    (``cols``, input rows from ``a0``; the channel's cells from row ``first``) of the cells
    reaching it, in CpuRef's order (ky, then kx). Each cell adds one run over all the rows:
    the zero margins of the padded input make a run's ends read zeros, not the next row."""
    sh, sw, left, pitch = geo[2], geo[3], geo[14], geo[15]
    a1 = a0 + cols.shape[1] // pitch
    for ry in range(sh):
        rows = min(r1, ytab[ry, 0]) - r0
        for rx in range(sw):
            phase = acc[ry * sw + rx]
            phase[: max(0, rows) * pitch] = 0
            width = xtab[rx, 0]
            for a in range(ytab[ry, 1]):
                row_cell, dy = ytab[ry, 2 + 2 * a], ytab[ry, 3 + 2 * a]  # ky * kw, and its offset
                j0, j1 = max(r0, a0 - dy), min(r0 + rows, a1 - dy)  # rows that read the block
                if j1 <= j0:
                    continue
                start, size = (j0 - r0) * pitch + left, (j1 - j0 - 1) * pitch + width
                for b in range(xtab[rx, 1]):
                    cell, dx = row_cell + xtab[rx, 2 + 2 * b], xtab[rx, 3 + 2 * b]
                    at = (j0 + dy - a0) * pitch + left + dx
                    # a loop from 0 over views: LLVM vectorizes it (not one over offset indices)
                    dst, src = phase[start : start + size], cols[first + cell, at : at + size]
                    for i in range(size):
                        dst[i] += src[i]


@njit(nogil=True, cache=True)
def _store_rows(acc, plane, r0, r1, geo, ytab, xtab, b):
    """One output channel's rows of phase rows ``r0 .. r1`` (every ``ry``): the phases in
    ``acc`` interleaved, with bias ``b``, into ``plane``. By index of the whole arrays, and
    unsigned (numba checks signed indices for negatives, which keeps a loop scalar): a view
    (a slice) costs about 10 ns, and this stored several a row (a 2x kernel's rows are 16
    to 64 values); at column stride 2 the paired stores vectorize."""
    sh, sw, ow, left, pitch = geo[2], geo[3], geo[11], geo[14], geo[15]
    u8 = np.uint64
    for j in range(r0, r1):
        at = u8((j - r0) * pitch + left)
        for ry in range(sh):
            if j >= ytab[ry, 0]:
                continue
            o = u8((ry + sh * j) * ow)
            if sw == 1:
                for i in range(u8(ow)):
                    plane[o + i] = acc[ry, at + i] + b
            elif sw == 2:
                even, odd, pairs = u8(2 * ry), u8(2 * ry + 1), u8(xtab[1, 0])
                for i in range(pairs):
                    plane[o + u8(2) * i] = acc[even, at + i] + b
                    plane[o + u8(2) * i + u8(1)] = acc[odd, at + i] + b
                if xtab[0, 0] > xtab[1, 0]:
                    plane[o + u8(2) * pairs] = acc[even, at + pairs] + b
            else:
                for rx in range(sw):
                    for i in range(xtab[rx, 0]):
                        plane[o + u8(rx + sw * i)] = acc[ry * sw + rx, at + u8(i)] + b


@njit(nogil=True, cache=True)
def _slices(x, panels, w, gemm_bias, bias, out, geo, ytab, xtab, bands, parts, blocks, first_task, last_task):
    """Slices ``first_task .. last_task`` in turn; the slice ``((image * groups + group) *
    bands + b) * parts + c`` is phase rows ``bands[b] .. bands[b + 1]`` of output channels
    ``parts[c] .. parts[c + 1]`` of one image's group. Called from Python for all of them when
    the work is too small to split, else from the parallel region for one each. ``x`` is the
    input, its rows padded to pitch."""
    for task in range(first_task, last_task):
        _slice(x, panels, w, gemm_bias, bias, out, geo, ytab, xtab, bands, parts, blocks, task)


@njit(inline="always", nogil=True, cache=True)
def _slice(x, panels, w, gemm_bias, bias, out, geo, ytab, xtab, bands, parts, blocks, task):
    """One slice (see :func:`_slices`), a block of ``blocks[0]`` phase rows and ``blocks[1]``
    output channels at a time."""
    groups, rows_k, cg = w.shape
    cells, sh, sw, ih, pitch = geo[0] * geo[1], geo[2], geo[3], geo[8], geo[15]
    mg = rows_k // cells
    block_rows, chunk = blocks[0], blocks[1]
    rest, part = divmod(task, parts.shape[0] - 1)
    rest, b = divmod(rest, bands.shape[0] - 1)
    n, g = divmod(rest, groups)
    low, high = geo[12], geo[13]  # the least and greatest row offset dy of any cell
    buffer = np.empty(chunk * cells * (block_rows + high - low) * pitch, np.float32)
    acc = np.empty((sh * sw, block_rows * pitch), np.float32)
    tile_rows = panels.shape[3] if panels.shape[0] else 1
    for r0 in range(bands[b], bands[b + 1], block_rows):
        r1 = min(r0 + block_rows, bands[b + 1])
        # the input rows that phase rows r0 .. r1 read
        a0 = min(max(0, r0 + low), ih)
        a1 = max(a0, min(ih, r1 - 1 + high + 1))
        block = x[n, g * cg : (g + 1) * cg, a0 * pitch : a1 * pitch]
        for c0 in range(parts[part], parts[part + 1], chunk):
            c1 = min(c0 + chunk, parts[part + 1])
            cols = buffer[: (c1 - c0) * cells * (a1 - a0) * pitch].reshape(
                ((c1 - c0) * cells, (a1 - a0) * pitch)
            )
            # typed as Conv's calls are (cols[:, :] strided, the code no literal): one compile
            if a1 > a0 and panels.shape[0]:
                first = c0 * cells // tile_rows  # chunks start on a panel (see ``plan``)
                last = -(-c1 * cells // tile_rows)
                gemm_panels(panels[g, first:last], gemm_bias, block, cols[:, :], blocks[2], _ZERO, _ZERO)
            elif a1 > a0:
                sgemm(False, False, 1.0, w[g, c0 * cells : c1 * cells], block, 0.0, cols[:, :])
            for mm in range(c0, c1):
                m = g * mg + mm
                _sum_phases(cols, (mm - c0) * cells, r0, r1, a0, geo, ytab, xtab, acc)
                _store_rows(acc, out[n, m], r0, r1, geo, ytab, xtab, bias[m])


@njit(**NATIVE)
def _conv_transpose_slice(
    task, _step, x, panels, w, gemm_bias, bias, out, geo, ytab, xtab, bands, parts, blocks
):
    """Task ``task`` of :data:`_CONV_TRANSPOSE` (a ``SliceFunction``): one (image, group, band,
    channel part) slice."""
    _slices(x, panels, w, gemm_bias, bias, out, geo, ytab, xtab, bands, parts, blocks, task, task + 1)


_CONV_TRANSPOSE = SliceFunction(_conv_transpose_slice)


def _conv_transpose_parallel(x, panels, w, gemm_bias, bias, out, geo, ytab, xtab, bands, parts, blocks):
    """Every (image, group, band, channel part) slice, spread over the workers."""
    tasks = x.shape[0] * w.shape[0] * (bands.shape[0] - 1) * (parts.shape[0] - 1)
    args = (x, panels, w, gemm_bias, bias, out, geo, ytab, xtab, bands, parts, blocks)
    _CONV_TRANSPOSE.run(tasks, args)


def _axis_phases(s: int, p: int, k: int, d: int, out: int, size: int, scale: int) -> np.ndarray:
    """One axis's phases, a row each: the phase's length, its cell count, then per cell
    ``(cell * scale, offset)``: output ``r + s * j`` reads input ``j + offset`` through that
    cell. Cells that read only outside the input are left out."""
    table = np.zeros((s, 2 + 2 * k), np.int64)
    for r in range(s):
        length = len(range(r, out, s))
        cells = [
            (cell * scale, (r + p - cell * d) // s)
            for cell in range(k)
            if (r + p - cell * d) % s == 0
            and (r + p - cell * d) // s < size
            and length - 1 + (r + p - cell * d) // s >= 0
        ]
        table[r, :2] = length, len(cells)
        table[r, 2 : 2 + 2 * len(cells)] = np.array(cells, np.int64).reshape(-1)
    return table


def _margins(xtab: np.ndarray, iw: int) -> tuple[int, int]:
    """(left, pitch) of the padded input rows: a zero margin on each side for the runs of
    cells that reach past a row, and room for a phase row (columns left .. left + width)."""
    shifts = [
        (int(xtab[r, 0]), int(xtab[r, 3 + 2 * a])) for r in range(xtab.shape[0]) for a in range(xtab[r, 1])
    ]
    left = max([0] + [-dx for _, dx in shifts])
    return left, max([left + iw, left + int(xtab[:, 0].max())] + [left + width + dx for width, dx in shifts])


class _Plan(NamedTuple):
    """How one input shape runs: geometry, phase tables, and the split."""

    # kh, kw, sh, sw, dh, dw, ph, pw, ih, iw, oh, ow (2-D; 1-D is 2-D with one row), the least
    # and greatest row offset of any cell, and the padded rows' left margin and pitch
    geo: np.ndarray
    out_shape: tuple[int, ...]
    padded_shape: tuple[int, ...]  # the input, its rows padded to pitch (== its shape if not)
    ytab: np.ndarray  # row phases (_axis_phases, cells as ky * kw)
    xtab: np.ndarray  # column phases
    bands: np.ndarray  # phase-row boundaries of the slices
    parts: np.ndarray  # output-channel boundaries of the slices (a split when bands are too few)
    parallel: bool
    blocks: np.ndarray  # phase rows and output channels per GEMM, and the GEMM's activation (none)


@acc_kernel("ConvTranspose")
class ConvTransposeKernel:
    """1-D and 2-D float32 ConvTranspose with groups, strides, dilations, pads, output_padding,
    output_shape and auto_pad; the bias is added as the output is stored."""

    # Its split is planned per call, by the threads the job running it has now.
    takes_job = True

    @classmethod
    def supports(cls, info: WorkloadInfo) -> Support:
        if any(t is not None and t.dtype is not DataType.FLOAT32 for t in info.inputs):
            return Support.no("CpuAcc ConvTranspose takes float32 only")
        ranks = {len(t.shape) for t in info.inputs[:2] if t is not None and t.shape is not None}
        if len(ranks) != 1 or not ranks <= {3, 4}:
            found = "unknown" if not ranks else " and ".join(str(r - 2) for r in sorted(ranks))
            return Support.no(f"CpuAcc ConvTranspose takes 1-D or 2-D spatial data only, got {found}-D")
        return Support.yes()

    def __init__(self, info: WorkloadInfo, workers: int) -> None:
        if info.activation is not None:
            # not offered (backend.FUSED_ACTIVATION_KINDS): each kind's curve costs compile time
            raise BackendError(f"CpuAcc ConvTranspose {info.layer_name!r} cannot apply a fused activation")
        self.info = info
        self.workers = workers
        self.desc = info.descriptor
        constants = tuple(info.constants) + (None,) * 3
        self.weights_shape = None if constants[1] is None else tuple(constants[1].shape)
        self.weights = None if constants[1] is None else self._pack(constants[1])
        # copies: a constant is read-only, and numba compiles anew for a read-only array
        self.bias = None if constants[2] is None else np.array(constants[2], np.float32)
        # Split and block knobs, per instance so that tests can force many slices and blocks.
        self.min_slice_macs = MIN_SLICE_MACS
        self.block_floats = BLOCK_FLOATS
        self.chunk_floats = CHUNK_FLOATS
        self._plans: dict[tuple[int, ...], _Plan] = {}

    def _pack(
        self, w: np.ndarray, tiles: bool = TILES_AVAILABLE
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Weights (C, M/group, *kernel) as each group's GEMM operand (M/group * cells,
        C/group), rows by output channel then kernel cell; its register-tile panels (empty
        where BLAS runs it: no ``tiles``, or weights past ``TILES_MAX_WEIGHTS``); and the zero
        bias those take."""
        group, c = self.desc.group, w.shape[0]
        # a copy, never a view of a read-only constant (see ``__init__``)
        rows = np.array(
            np.asarray(w, np.float32).reshape(group, c // group, -1).transpose(0, 2, 1), order="C"
        )
        if not tiles or rows.shape[1] * rows.shape[2] > TILES_MAX_WEIGHTS:
            return rows, _NO_PANELS, np.zeros(0, np.float32)
        panels = np.stack([pack_panels(rows[g]) for g in range(group)])
        return rows, panels, pad_rows(np.zeros(rows.shape[1], np.float32))

    def plan(self, x_shape: tuple[int, ...], w_shape: tuple[int, ...], workers: int) -> _Plan:
        """The geometry, phases and split for one input shape over ``workers``, computed once."""
        key = (*x_shape, *w_shape, workers)
        cached = self._plans.get(key)
        if cached is not None:
            return cached
        kernel = tuple(w_shape[2:])
        g = conv_transpose_geometry(self.desc, x_shape[2:], kernel)
        out, begins = static_dims(g.out), static_dims(g.pads_begin)  # known, as x_shape is
        lift = (1,) * (2 - len(kernel))  # 1-D as 2-D with one row: kernel, stride 1, no pad
        kh, kw = (*lift, *kernel)
        (sh, sw), (dh, dw) = (*lift, *g.strides), (*lift, *g.dilations)
        (ph, pw), (oh, ow) = (0,) * len(lift) + begins, (*lift, *out)
        ih, iw = (*lift, *x_shape[2:])
        ytab = _axis_phases(sh, ph, kh, dh, oh, ih, kw)
        xtab = _axis_phases(sw, pw, kw, dw, ow, iw, 1)
        offsets = [int(ytab[r, 3 + 2 * a]) for r in range(sh) for a in range(ytab[r, 1])] or [0]
        left, pitch = _margins(xtab, iw)
        n, group, mg, cg = x_shape[0], self.desc.group, w_shape[1], x_shape[1] // self.desc.group
        halo = max(offsets) - min(offsets)
        block_rows = max(1, self.block_floats // (cg * pitch) - halo)
        pixels = min(block_rows + halo, ih) * pitch
        unit = TILE_ROWS // math.gcd(kh * kw, TILE_ROWS)  # a chunk of channels starts on a panel
        chunk = min(mg, max(unit, self.chunk_floats // (kh * kw * pixels) // unit * unit))
        split = self._split(n * group, int(ytab[:, 0].max()), mg, unit, kh * kw * mg * cg * ih * iw, workers)
        geo = [kh, kw, sh, sw, dh, dw, ph, pw, ih, iw, oh, ow, min(offsets), max(offsets), left, pitch]
        cached = self._plans[key] = _Plan(
            np.array(geo, np.int64),
            (n, group * mg, *out),
            (n, x_shape[1], ih * pitch),
            ytab,
            xtab,
            *split,
            np.array([block_rows, chunk, NONE], np.int64),
        )
        return cached

    def _split(
        self, planes: int, rows: int, mg: int, unit: int, macs: int, workers: int
    ) -> tuple[np.ndarray, np.ndarray, bool]:
        """(bands, parts, parallel): phase rows per slice, and output channels per slice where
        ``planes`` (images times groups) of too few rows leave workers idle (1-D, say), in
        units of ``unit`` channels; ``macs`` is the GEMM's work per plane."""
        bands = split_bounds(
            rows, SplitHint(0, max(1, int(self.min_slice_macs * rows // max(macs, 1)))), workers
        )
        tasks = planes * (len(bands) - 1)
        count = min(-(-mg // unit), max(1, workers // tasks), max(1, macs // max(1, self.min_slice_macs)))
        parts = np.minimum(split_bounds(-(-mg // unit), SplitHint(0, 1), count) * unit, mg)
        parallel = workers > 1 and tasks * (len(parts) - 1) > 1 and planes * macs >= 2 * self.min_slice_macs
        return bands, parts, parallel

    def execute(self, inputs, outputs=None, job: JobContext | None = None):
        x = np.ascontiguousarray(inputs[0], np.float32)
        packed, w_shape = self.weights, self.weights_shape
        if packed is None or w_shape is None:  # the weights are an input: packed per call
            packed, w_shape = self._pack(inputs[1]), tuple(inputs[1].shape)
        w, panels, gemm_bias = packed
        workers = self.workers if job is None else max(1, min(self.workers, job.threads))
        plan = self.plan(x.shape, w_shape, workers)
        out = np.empty(plan.out_shape, np.float32) if outputs is None else outputs[0]
        bias = self._bias(inputs, out.shape[1])
        if out.size == 0:
            return [out]
        args = (
            self._padded(x, plan), panels, w, gemm_bias, bias, out.reshape(out.shape[0], out.shape[1], -1),
            plan.geo, plan.ytab, plan.xtab, plan.bands, plan.parts, plan.blocks,
        )  # fmt: skip
        if plan.parallel:
            _conv_transpose_parallel(*args)
        else:
            _slices(*args, 0, x.shape[0] * w.shape[0] * (len(plan.bands) - 1) * (len(plan.parts) - 1))
        return [out]

    def _bias(self, inputs, channels: int) -> np.ndarray:
        """The bias: the constant, a (writable) copy of the input, or zeros."""
        if self.bias is not None:
            return self.bias
        if len(inputs) > 2 and inputs[2] is not None:
            return np.array(inputs[2], np.float32)
        return np.zeros(channels, np.float32)

    @staticmethod
    def _padded(x: np.ndarray, plan: _Plan) -> np.ndarray:
        """The input as (N, C, rows * pitch): itself, or a copy with zero margins."""
        n, c, ih, iw = x.shape[0], x.shape[1], int(plan.geo[8]), int(plan.geo[9])
        if plan.padded_shape[2] == ih * iw:
            return x.reshape(n, c, -1)
        padded = np.zeros(plan.padded_shape, np.float32)
        left = int(plan.geo[14])
        padded.reshape(n, c, ih, -1)[..., left : left + iw] = x.reshape(n, c, ih, iw)
        return padded
