"""The loop nest of CpuAcc's Winograd convs, shared by F(2x2, 3x3) (``winograd.py``, which
describes the scheme and the layout) and F(4x4, 3x3) (``winograd4.py``): phase planes per
channel, blocks of tile rows per slice, one GEMM per transformed tile element, and the output
tiles written back with bias and activation. The two differ only in their transforms, which
are functions of their own with their tile sizes as constants, called by address: the loop
nest takes the side as an argument and is compiled once for both (on a cold cache a side's
own loop nest took 12-14 s of CPU, and the branches on the side are taken once per row of
tiles), and a model compiles only the transforms of the tile sizes it uses. Its parallel
loops call their tasks by address (``blas.run_stages``). The GEMMs run on CpuAcc's register
tiles (``tiles.gemm_panels``) where the host has them, the filters' transforms kept as their
panels: on one Zen 5 core, 256 -> 256 channels at 14x14 took 1.19 ms with OpenBLAS's SGEMM
and 0.74 ms so; elsewhere on BLAS. :class:`Winograd` is the algorithm
that runs it: the 3x3 stride-1 convs of one group that :class:`~.winograd.WinogradRule` picks.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

import attrs
import numba
import numpy as np
from numba import njit, types
from numba._dispatcher import compute_fingerprint
from numpy.lib.stride_tricks import as_strided

from flowrt.engine.scheduler.window import SplitHint, split_bounds
from flowrt.workers.cpu.acc.blas import (
    NATIVE,
    SliceFunction,
    call_native,
    gemm_at,
    native_address,
    run_stages,
)
from flowrt.workers.cpu.acc.conv.finish import finish_row_late
from flowrt.workers.cpu.acc.conv.winograd import (
    fill_phases4,
    input_transform2,
    interleave2,
    output_transform2,
    spread,
    winograd_blocks,
)
from flowrt.workers.cpu.acc.conv.winograd4 import input_transform4, interleave4, output_transform4
from flowrt.workers.cpu.acc.phases import fill_phase_planes_late
from flowrt.workers.cpu.acc.tile_ir import AVAILABLE as TILES_AVAILABLE
from flowrt.workers.cpu.acc.tile_ir import PANEL_LAYOUT
from flowrt.workers.cpu.acc.tiles import gemm_panels, pack_panels

if TYPE_CHECKING:
    from flowrt.workers.cpu.acc.conv.algorithms import ActArgs
    from flowrt.workers.cpu.acc.conv.geometry import ConvGeometry
    from flowrt.workers.cpu.acc.conv.tuning import ConvTuning
    from flowrt.workers.cpu.acc.conv.weights import ConvWeights

_ROW = types.Array(types.float32, 1, "C")
_VIEW = types.Array(types.float32, 2, "A")
# What the transforms take (see winograd.py): (phases, base, size, start, pitch, tmp, v, vrow,
# at, n) forward, (m, mrow, at, tmp, y, yrow, n) back.
_FORWARD = (_ROW, *[types.int64] * 4, _ROW, _ROW, *[types.int64] * 3)
_BACK = (_ROW, types.int64, types.int64, _ROW, _ROW, types.int64, types.int64)
_TRANSFORMS = {2: (input_transform2, output_transform2), 4: (input_transform4, output_transform4)}
_addresses: dict[int, tuple[int, int]] = {}
# Output channels per task from which a block's rows that do not split evenly over the workers
# are split by output channels instead (each task transforms the block's whole input). Two
# workers, 7 rows of tiles (4 + 3 by rows): 256 -> 256 at 14x14 1.19 -> 0.99 ms, 48 -> 192 at
# 13x13 0.40 -> 0.28, 128 -> 128 at 28x28 (4x4 tiles) 1.11 -> 1.04.
MIN_PART_CHANNELS = 64


def transform_addresses(side: int) -> tuple[int, int]:
    """The addresses of the forward and back transforms for ``side`` x ``side`` output tiles,
    compiled (or loaded from numba's cache) once per process: a model whose convs all take
    one tile size compiles that size's transforms only."""
    found = _addresses.get(side)
    if found is None:
        forward, back = _TRANSFORMS[side]
        found = _addresses[side] = (native_address(forward, _FORWARD), native_address(back, _BACK))
    return found


@njit(**NATIVE)
def _fill_task(task, step, x, phases, group, pad_h, pad_w, pitch, side, chunks, split):
    """Group ``step``'s (image, channel) planes, the ``task``-th of ``chunks`` runs of them,
    into their phase planes (none past the last image): plane ``p`` of the group's at
    ``phases[p * side * side * size:]``; by ``winograd.fill_phases4`` at address ``split``
    (:func:`split_address`), else by ``phases.fill_phase_planes``."""
    images, channels, height, width = x.shape
    planes = side * side
    size = phases.shape[0] // (group * channels * planes)
    total = min(group, images - step * group) * channels
    xf = x.reshape(-1)
    parts = np.empty(height * width if split else 0, np.float32)
    for plane in range(task * total // chunks, (task + 1) * total // chunks):
        base = plane * planes * size
        n, c = divmod(step * group * channels + plane, channels)
        if split:
            at = (n * channels + c) * height * width
            call_native(split, (xf, at, height, width, phases, base, size, pad_h, pad_w, pitch, parts))
        else:
            dst = phases[base : base + planes * size]
            fill_phase_planes_late(dst, x[n, c], size // pitch, pitch, size, side, side, pad_h, pad_w)


_split_addresses: dict[bytes, int] = {}


def split_address(x: np.ndarray) -> int:
    """The address of ``winograd.fill_phases4`` for the flat view of ``x`` (read-only or
    not), compiled (or loaded from numba's cache) on first use: only convs in 4x4 tiles whose
    width is a multiple of 4 call it."""
    key = compute_fingerprint(x)
    found = _split_addresses.get(key)
    if found is None:
        flat = numba.typeof(x.reshape(-1))
        signature = (flat, *[types.int64] * 3, _ROW, *[types.int64] * 5, _ROW)
        found = _split_addresses[key] = native_address(fill_phases4, signature)
    return found


@njit(**NATIVE)
def _block_task(
    task, step, x, u, panels, multiply, bias, out, phases, bounds, parts, block, group, code, alpha, beta, side,
    forward, back,
):  # fmt: skip
    """Group ``step``'s task: slice ``task // parts`` of tile rows, ``block`` rows at a time,
    for part ``task % parts`` of the output channels (see :func:`winograd_conv`); ``forward``
    and ``back``: the addresses of the side's transforms; ``multiply``: the address of
    ``tiles.gemm_panels`` for ``panels``, or 0 (the GEMMs by BLAS on ``u``)."""
    elements, outputs = (side + 2) * (side + 2), side * side  # per input tile, per output tile
    s, part = divmod(task, parts)
    channels, all_m = x.shape[1], out.shape[1]
    # this task's output channels: whole groups of 8, the last part takes the rest
    eights = -(-all_m // 8)
    m_first = min(all_m, part * eights // parts * 8)
    m_count = min(all_m, (part + 1) * eights // parts * 8) - m_first
    oh_count, ow_count = out.shape[2], out.shape[3]
    tiles_h, tiles_w = (oh_count + side - 1) // side, (ow_count + side - 1) // side
    pitch = tiles_w + 1
    cols = block * pitch
    n0 = step * group
    rows = min(group, x.shape[0] - n0) * tiles_h
    planes = channels * side * side  # per image
    size = phases.shape[0] // (group * planes)
    # Flat (elements, channels x cols) and (elements, outputs x cols), rows apart by a spread
    # stride; F(4x4) passes its transforms' rows through tmp. The output tiles' rows go to y,
    # ``count`` apart: the activation then runs over all of them at once.
    vrow, mrow = spread(channels * cols), spread(m_count * cols)
    v = np.empty(elements * vrow, np.float32)
    mb = np.empty(elements * mrow, np.float32)
    tmp = np.empty(elements * cols if side == 4 else 0, np.float32)
    y = np.empty(outputs * cols, np.float32)
    of = out.reshape(-1)
    u_at, v_at, m_at = np.int64(u.ctypes.data), np.int64(v.ctypes.data), np.int64(mb.ctypes.data)
    plain, one, zero = np.int64(0), np.float32(1), np.float32(0)  # not literals: gemm_at's types
    no_bias = np.zeros(panels.shape[1] * panels.shape[3], np.float32)
    for row0 in range(bounds[s], min(bounds[s + 1], rows), block):
        row1 = min(row0 + block, bounds[s + 1], rows)
        count = (row1 - row0) * pitch
        for c in range(channels):
            # the block's rows of tiles, one image's run of them at a time
            th = row0
            while th < row1:
                i = th // tiles_h
                end = min(row1, (i + 1) * tiles_h)
                base = i * planes * size + c * side * side * size
                at, start = c * cols + (th - row0) * pitch, (th - i * tiles_h) * pitch
                n = (end - th) * pitch
                call_native(forward, (phases, base, size, start, pitch, tmp, v, vrow, at, n))
                th = end
        for e in range(elements):
            # (m_count, channels) @ (channels, count), v's and mb's rows cols apart
            if multiply != 0:  # by register tiles, from the panels of this part's channels
                # strided views, not reshaped slices: a reshape's result passes through memory,
                # and each kept an incref and a decref of v and of mb (two atomics and two calls)
                b = as_strided(v[e * vrow :], shape=(channels, count), strides=(cols * 4, 4))
                c = as_strided(mb[e * mrow :], shape=(m_count, count), strides=(cols * 4, 4))
                call_native(multiply, (panels[e, m_first // 8 :], no_bias, b, c, plain, zero, zero))
                continue
            gemm_at(
                plain, plain, m_count, count, channels, one, u_at + (e * all_m + m_first) * channels * 4,
                channels, v_at + e * vrow * 4, cols, zero, m_at + e * mrow * 4, cols,
            )  # fmt: skip
        for j in range(m_count):
            k = m_first + j
            call_native(back, (mb, mrow, j * cols, tmp, y, count, count))
            finish_row_late(y[: outputs * count], bias[k], code, alpha, beta)
            for th in range(row0, row1):
                q = (th - row0) * pitch
                image = n0 + th // tiles_h
                for a in range(side):
                    oh = side * (th % tiles_h) + a
                    if oh >= oh_count:
                        continue
                    at = ((image * all_m + k) * oh_count + oh) * ow_count
                    if side == 2:
                        interleave2(of, at, ow_count, y, 2 * a * count + q, (2 * a + 1) * count + q)
                    else:
                        interleave4(of, at, ow_count, y, 4 * a * count + q, count)


# What winograd_conv passes for the operand it does not use.
_NO_U = np.zeros((0, 0, 0), np.float32)
_NO_PANELS = np.zeros((0, 0, 0, PANEL_LAYOUT[0]), np.float32)
_multiply_addresses: dict[bytes, int] = {}


def winograd_panels(u: np.ndarray) -> np.ndarray:
    """The filters' transforms ``u`` (elements, M, C) as register-tile panels per element
    (``tiles.pack_panels``): the GEMMs' left operands for ``tiles.gemm_panels``."""
    return np.stack([pack_panels(u[e]) for e in range(u.shape[0])])


def winograd_multiply(panels: np.ndarray) -> int:
    """The address of ``tiles.gemm_panels`` for one element's panels of ``panels``, strided
    views of the transformed tiles, no activation: what :func:`_block_task` calls by address,
    compiled (or loaded from numba's cache) once."""
    key = compute_fingerprint(panels)
    found = _multiply_addresses.get(key)
    if found is None:
        one = numba.typeof(panels[0])
        signature = (one, _ROW, _VIEW, _VIEW, types.int64, types.float32, types.float32)
        found = _multiply_addresses[key] = native_address(gemm_panels, signature)
    return found


_FILL_TASK = SliceFunction(_fill_task)
_BLOCK_TASK = SliceFunction(_block_task)


def winograd_conv(x, u, bias, out, pad_h, pad_w, bounds, parts, block, group, code, alpha, beta, side):
    """Every image, ``group`` at a time (:func:`~.winograd.winograd_blocks`): the group's
    channels into phase planes, a run of them per task, then one task per slice of the
    group's rows of tiles (``bounds``: image after image) and part of the output channels (of
    ``parts``), ``block`` tile rows at a time, in output tiles of ``side`` x ``side`` (2 or 4).
    ``u``: the filters' transforms for that side (:func:`~.winograd.winograd_weights`,
    :func:`~.winograd4.winograd4_weights`), (elements, M, C) for BLAS, or as register-tile
    panels per element (elements, M / TILE_ROWS, C, TILE_ROWS: :func:`winograd_panels`);
    ``bias``: one per output channel."""
    if u.ndim == 4:
        panels, u, multiply = u, _NO_U, winograd_multiply(u)
    else:
        panels, multiply = _NO_PANELS, 0
    side = np.int64(side)
    tiles_h, pitch = -(-out.shape[2] // side), -(-out.shape[3] // side) + 1
    # A block reads one tile row and one column past its tiles: one spare row keeps it inside.
    size = spread.py_func((tiles_h + 2) * pitch)
    phases = np.zeros(group * x.shape[1] * side * side * size, np.float32)
    tasks = (bounds.shape[0] - 1) * parts
    chunks = min(group * x.shape[1], tasks)  # as many as there are tasks
    split = split_address(x) if side == 4 and x.shape[3] % 4 == 0 else 0
    fill = (x, phases, group, pad_h, pad_w, pitch, side, chunks, split)
    forward, back = transform_addresses(int(side))
    blocks = (
        x, u, panels, multiply, bias, out, phases, bounds, parts, block, group, code, alpha, beta, side, forward,
        back,
    )  # fmt: skip
    run_stages(
        -(-x.shape[0] // group),
        _FILL_TASK.address(fill),
        chunks,
        fill,
        _BLOCK_TASK.address(blocks),
        tasks,
        blocks,
    )


def _tile(geometry: ConvGeometry, tuning: ConvTuning) -> int:
    """The output tile's side Winograd takes ``geometry`` in (2 or 4), or 0 where it does not:
    not 3x3 stride 1 in one group, or ``tuning.winograd_rule`` finds GEMM faster."""
    g = geometry.window
    if not (
        geometry.groups == 1 and geometry.kernel == (3, 3) and g.strides == (1, 1) and g.dilations == (1, 1)
    ):
        return 0
    blocks = (geometry.x_shape[0], tuning.winograd_block_tiles, tuning.winograd_group_tiles)
    group = winograd_blocks(geometry.out_hw, 2, *blocks)[1]  # images per group with 2x2 tiles
    return tuning.winograd_rule.tile(
        geometry.w_shape[1], geometry.mg, geometry.out_hw, group, tuning.fast_math
    )


@attrs.frozen(eq=False)
class Winograd:
    """Plan of a conv by :func:`winograd_conv`: output tiles of ``tile`` x ``tile``, ``group``
    images transformed together, ``bounds`` rows of tiles per slice, ``block`` per block, the
    output channels in ``parts``."""

    name: ClassVar[str] = "winograd"
    tile: int
    geo: np.ndarray  # the pads are read from it
    bounds: np.ndarray
    parts: np.int64
    block: int
    group: int

    @classmethod
    def applies(cls, geometry: ConvGeometry, tuning: ConvTuning) -> bool:
        """A 3x3 stride-1 conv of one group that the Winograd rule picks."""
        return _tile(geometry, tuning) > 0

    @classmethod
    def plan(cls, geometry: ConvGeometry, tuning: ConvTuning) -> Winograd:
        """Blocks and groups of tiles, the group's rows of tiles split over the workers; or,
        where those rows are one block that does not split evenly (7 rows of tiles, a 14x14
        or 28x28 output), its output channels: each task then transforms the whole block's
        input, a small part of its work beside the GEMMs where each task has
        ``MIN_PART_CHANNELS`` output channels or more, so that the workers finish together."""
        tile = _tile(geometry, tuning)
        blocks = (geometry.x_shape[0], tuning.winograd_block_tiles, tuning.winograd_group_tiles)
        block, group = winograd_blocks(geometry.out_hw, tile, *blocks)
        rows = group * -(-geometry.out_hw[0] // tile)
        bounds = split_bounds(rows, SplitHint(0, 1), geometry.workers)
        slices = bounds.shape[0] - 1
        uneven = int(np.diff(bounds).max()) * slices > rows
        if slices > 1 and uneven and rows <= block and geometry.mg >= MIN_PART_CHANNELS * slices:
            return cls(tile, geometry.geo(), np.array([0, rows], np.int64), np.int64(slices), block, group)
        # A block is no wider than a slice: each task's buffers are laid out for a block's
        # columns, and a half-used one spread its transformed tiles twice as far (96 -> 32
        # channels at 64x64 on two workers, 16 rows a block, 8 a slice: 414-444 us, 357-361
        # at 8; the U-Net of the zoo's Winograd convs 3.42-3.52 -> 3.15-3.23 ms a run).
        block = min(block, int(np.diff(bounds).max()))
        return cls(tile, geometry.geo(), bounds, np.int64(1), block, group)

    def forms(self, weights: ConvWeights, w, w_shape, bias, constant: bool) -> None:
        """See ``algorithms.ConvAlgorithm``."""
        self.transforms(weights, w, w_shape)

    def transforms(self, weights: ConvWeights, w, w_shape) -> np.ndarray:
        """The filters' transforms as the GEMMs read them: register-tile panels where the
        host has the tiles, else matrices for BLAS."""
        if TILES_AVAILABLE:
            return weights.winograd_panels(w, w_shape, self.tile)
        return weights.winograd(w, w_shape, self.tile)

    def run(
        self, weights: ConvWeights, x, w, w_shape, bias, out, finish: bool, constant: bool, act: ActArgs
    ) -> None:
        """See ``algorithms.ConvAlgorithm.run``."""
        u = self.transforms(weights, w, w_shape)
        pads = self.geo[6:8]
        blocks = (self.bounds, self.parts, self.block, self.group)
        winograd_conv(x, u, bias, out, pads[0], pads[1], *blocks, *act, self.tile)
