"""The loop nest of CpuAcc's Winograd convs, shared by F(2x2, 3x3) (``winograd.py``, which
describes the scheme and the layout) and F(4x4, 3x3) (``winograd4.py``): phase planes per
channel, blocks of tile rows per slice, one GEMM per transformed tile element, and the output
tiles written back with bias and activation. The two differ only in their transforms, which
are functions of their own with their tile sizes as constants; the loop nest takes the side
as an argument and is compiled once for both (on a cold cache a side's own loop nest took
12-14 s of CPU, and the branches on the side are taken once per row of tiles). Its parallel
loops call their tasks by address (``blas.run_stages``). :class:`Winograd` is the algorithm
that runs it: the 3x3 stride-1 convs of one group that :class:`~.winograd.WinogradRule` picks.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

import attrs
import numpy as np
from numba import njit

from flowrt.engine.scheduler.window import SplitHint, split_bounds
from flowrt.workers.cpu.acc.blas import SliceFunction, run_stages, sgemm
from flowrt.workers.cpu.acc.conv.winograd import (
    fill_phases,
    input_transform2,
    interleave2,
    output_transform2,
    spread,
    winograd_blocks,
)
from flowrt.workers.cpu.acc.conv.winograd4 import input_transform4, interleave4, output_transform4
from flowrt.workers.cpu.acc.kernels.epilogue import activate_row

if TYPE_CHECKING:
    from flowrt.workers.cpu.acc.conv.geometry import ConvGeometry
    from flowrt.workers.cpu.acc.conv.tuning import ConvTuning
    from flowrt.workers.cpu.acc.conv.weights import ConvWeights


@njit(nogil=True, cache=True)
def _fill_task(task, step, x, phases, group, pad_h, pad_w, pitch, side, chunks):
    """Group ``step``'s (image, channel) planes, the ``task``-th of ``chunks`` runs of them,
    into their phase planes (none past the last image)."""
    channels = x.shape[1]
    total = min(group, x.shape[0] - step * group) * channels
    for plane in range(task * total // chunks, (task + 1) * total // chunks):
        i, c = divmod(plane, channels)
        fill_phases(x[step * group + i, c], phases[i, c], pad_h, pad_w, pitch, side)


@njit(nogil=True, cache=True)
def _block_task(s, step, x, u, bias, out, phases, bounds, block, group, code, alpha, beta, side):
    """Group ``step``'s slice ``s`` of tile rows, ``block`` rows at a time (see
    :func:`winograd_conv`)."""
    elements, outputs = (side + 2) * (side + 2), side * side  # per input tile, per output tile
    channels, m_count = x.shape[1], out.shape[1]
    oh_count, ow_count = out.shape[2], out.shape[3]
    tiles_h, tiles_w = (oh_count + side - 1) // side, (ow_count + side - 1) // side
    pitch = tiles_w + 1
    cols = block * pitch
    n0 = step * group
    rows = min(group, x.shape[0] - n0) * tiles_h
    # (elements, channels x cols) and (elements, outputs x cols), rows apart by a spread
    # stride; F(4x4) passes its transforms' rows through tmp (F(2x2): none)
    v = np.empty((elements, spread(channels * cols)), np.float32)
    mb = np.empty((elements, spread(m_count * cols)), np.float32)
    tmp = np.empty((elements if side == 4 else 0, cols), np.float32)
    y = np.empty((outputs, cols), np.float32)
    for row0 in range(bounds[s], min(bounds[s + 1], rows), block):
        row1 = min(row0 + block, bounds[s + 1], rows)
        count = (row1 - row0) * pitch
        for c in range(channels):
            # the block's rows of tiles, one image's run of them at a time
            th = row0
            while th < row1:
                i = th // tiles_h
                end = min(row1, (i + 1) * tiles_h)
                at, start = c * cols + (th - row0) * pitch, (th - i * tiles_h) * pitch
                n = (end - th) * pitch
                if side == 2:
                    input_transform2(phases[i, c], start, pitch, v, at, n)
                else:
                    input_transform4(phases[i, c], start, pitch, tmp, v, at, n)
                th = end
        for e in range(elements):
            ve = v[e, : channels * cols].reshape((channels, cols))
            me = mb[e, : m_count * cols].reshape((m_count, cols))
            sgemm(False, False, 1.0, u[e], ve[:, :count], 0.0, me[:, :count])
        for k in range(m_count):
            if side == 2:
                output_transform2(mb, k * cols, y, count)
            else:
                output_transform4(mb, k * cols, tmp, y, count)
            for e in range(outputs):
                activate_row(y[e, :count], y[e, :count], bias[k], code, alpha, beta)
            for th in range(row0, row1):
                q = (th - row0) * pitch
                for a in range(side):
                    oh = side * (th % tiles_h) + a
                    if oh >= oh_count:
                        continue
                    if side == 2:
                        interleave2(out[n0 + th // tiles_h, k, oh], y, 2 * a, q)
                    else:
                        interleave4(out[n0 + th // tiles_h, k, oh], y, 4 * a, q)


_FILL_TASK = SliceFunction(_fill_task)
_BLOCK_TASK = SliceFunction(_block_task)


def winograd_conv(x, u, bias, out, pad_h, pad_w, bounds, block, group, code, alpha, beta, side):
    """Every image, ``group`` at a time (:func:`~.winograd.winograd_blocks`): the group's
    channels into phase planes, a run of them per slice, then one task per slice of the
    group's rows of tiles (``bounds``: image after image), ``block`` tile rows at a time, in
    output tiles of ``side`` x ``side`` (2 or 4). ``u``: the filters' transforms for that side
    (:func:`~.winograd.winograd_weights`, :func:`~.winograd4.winograd4_weights`); ``bias``: one
    per output channel."""
    side = np.int64(side)
    tiles_h, pitch = -(-out.shape[2] // side), -(-out.shape[3] // side) + 1
    # A block reads one tile row and one column past its tiles: one spare row keeps it inside.
    planes = (group, x.shape[1], side * side, spread.py_func((tiles_h + 2) * pitch))
    phases = np.zeros(planes, np.float32)
    chunks = min(group * x.shape[1], bounds.shape[0] - 1)  # as many as there are slices
    fill = (x, phases, group, pad_h, pad_w, pitch, side, chunks)
    blocks = (x, u, bias, out, phases, bounds, block, group, code, alpha, beta, side)
    run_stages(
        -(-x.shape[0] // group),
        _FILL_TASK.address(fill),
        chunks,
        fill,
        _BLOCK_TASK.address(blocks),
        bounds.shape[0] - 1,
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
    return tuning.winograd_rule.tile(geometry.w_shape[1], geometry.mg, geometry.out_hw, group)


@attrs.frozen(eq=False)
class Winograd:
    """Plan of a conv by :func:`winograd_conv`: output tiles of ``tile`` x ``tile``, ``group``
    images transformed together, ``bounds`` rows of tiles per slice, ``block`` per block."""

    name: ClassVar[str] = "winograd"
    tile: int
    geo: np.ndarray  # the pads are read from it
    bounds: np.ndarray
    block: int
    group: int

    @classmethod
    def applies(cls, geometry: ConvGeometry, tuning: ConvTuning) -> bool:
        """A 3x3 stride-1 conv of one group that the Winograd rule picks."""
        return _tile(geometry, tuning) > 0

    @classmethod
    def plan(cls, geometry: ConvGeometry, tuning: ConvTuning) -> Winograd:
        """Blocks and groups of tiles, the group's rows of tiles split over the workers."""
        tile = _tile(geometry, tuning)
        blocks = (geometry.x_shape[0], tuning.winograd_block_tiles, tuning.winograd_group_tiles)
        block, group = winograd_blocks(geometry.out_hw, tile, *blocks)
        rows = group * -(-geometry.out_hw[0] // tile)
        return cls(tile, geometry.geo(), split_bounds(rows, SplitHint(0, 1), geometry.workers), block, group)

    def run(
        self, weights: ConvWeights, x, w, w_shape, bias, out, finish: bool, constant: bool, act: Any
    ) -> None:
        """See ``algorithms.ConvAlgorithm.run``."""
        u = weights.winograd(w, w_shape, self.tile)
        pads = self.geo[6:8]
        blocks = (self.bounds, self.block, self.group)
        winograd_conv(x, u, bias, out, pads[0], pads[1], *blocks, *act, self.tile)
