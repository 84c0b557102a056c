"""A strided conv by register tiles that read its input windows where they lie: no column matrix.

A stride-2 conv's im2col is a gather: the Compute Library and ONNX Runtime's NCHWc kernels
run such convs directly from the input. Here each image's padded channels are first split
into their phase planes (``phases.fill_phase_planes``, as :class:`~.columns.Columns` does),
where every kernel cell of an output row reads one unit-stride run. Row ``r`` of the GEMM's
right operand (channel ``r // (kh * kw)``, kernel cell ``r % (kh * kw)``) is then, for a block
of output pixels of one output row, the run at ``offsets[r]`` plus the block's own place in
the planes: the tiles read it there (``tile_ir._offset_tile``), so that nothing is copied
per block, and the column matrix (27 x 12,544 floats for a 3x3 stem at 224x224, 147 x 12,544
for a 7x7 one) is never written and read back. Blocks stay inside one output row, up to
``TILE_COLUMNS`` pixels; the weights are the register-tile panels of ``tiles.py``, walked in
blocks of k past :data:`DEPTH_MAX` steps (a 7x7 stem's 147 in one: in two blocks, as
``tiles.gemm_panels`` now walks them, it ran 3% slower).

One Zen 5 core, alone: a 3x3 stride-2 stem at 224x224, 3 -> 16 channels, 111-124 us by
columns, 86-96 here (ONNX Runtime's conv: 65, its reorder to NCHWc apart); 3 -> 32, 159 ->
136; a 7x7 one, 3 -> 64, 1.22-1.24 -> 1.01-1.03 ms. In the models, one core (two):
MobileNetV2's stem 243 -> 211 us (192 -> 149), MNASNet's 152 -> 122 (115 -> 86),
ResNet-18's 1.30 -> 1.08 ms (0.73 -> 0.60). :class:`Windows` is the algorithm.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

import attrs
import numpy as np
from numba import njit

from flowrt.workers.cpu.acc.blas import NATIVE, SliceFunction, run_stages
from flowrt.workers.cpu.acc.conv.columns import phase_shape
from flowrt.workers.cpu.acc.kernels.epilogue import CLIP, NONE, RELU, activate_in_place
from flowrt.workers.cpu.acc.phases import fill_phase_planes_late, phase_span
from flowrt.workers.cpu.acc.tile_ir import (
    CLIP_MODE,
    LANES,
    RELU_MODE,
    TILE_COLUMNS,
    TILE_ROWS,
    _offset_narrow_tile_part,
    _offset_tile,
    _offset_tile_part,
)
from flowrt.workers.cpu.acc.tiles import CURVE_BLOCK_FLOATS

if TYPE_CHECKING:
    from flowrt.workers.cpu.acc.conv.algorithms import ActArgs
    from flowrt.workers.cpu.acc.conv.geometry import ConvGeometry
    from flowrt.workers.cpu.acc.conv.tuning import ConvTuning
    from flowrt.workers.cpu.acc.conv.weights import ConvWeights

# Steps of k a tile takes at a time where k is longer than DEPTH_MAX (about DEPTH): the
# windows' rule (``tuning.windows_max_depth``) keeps to one block.
DEPTH = 128
DEPTH_MAX = 192


@njit(**NATIVE)
def _split_rows(task, n, phases, x, rows, pitch, sh, sw, ph, pw, chunks):
    """Phase rows ``task * rows // chunks ..`` of every channel of image ``n``, the
    ``task``-th of ``chunks`` runs of them, pad cells zeroed: channel ``c``'s planes at
    ``phases[c * sh * sw * rows * pitch:]``. By rows, not channels, so that a stem of three
    channels splits as well as any conv, and each task makes the rows its slice of the
    outputs reads most."""
    channels, height, width = x.shape[1], x.shape[2], x.shape[3]
    plane = rows * pitch
    r0, r1 = task * rows // chunks, (task + 1) * rows // chunks
    # input rows [start, stop) hold every row phase rows r0 .. r1 read
    start = min(height, max(0, r0 * sh - ph))
    stop = min(height, max(start, r1 * sh - ph))
    for c in range(channels):
        base = c * sh * sw * plane
        for i in range(sh):
            r_lo, r_hi = phase_span(i, height, rows, sh, ph)
            for j in range(sw):
                # the cells fill_phase_planes leaves alone: rows outside the input, and
                # columns left and right of it
                c_lo, c_hi = phase_span(j, width, pitch, sw, pw)
                for r in range(r0, r1):
                    at = np.uint64(base + (i * sw + j) * plane + r * pitch)
                    lo, hi = (c_lo, c_hi) if r_lo <= r < r_hi else (pitch, pitch)
                    for t in range(np.uint64(lo)):
                        phases[at + t] = 0
                    for t in range(np.uint64(hi), np.uint64(pitch)):
                        phases[at + t] = 0
        if stop > start:
            fill_phase_planes_late(
                phases[base + r0 * pitch : base + sh * sw * plane], x[n, c, start:stop], r1 - r0, pitch, plane,
                sh, sw, ph - r0 * sh + start, pw,
            )  # fmt: skip


@njit(inline="always", nogil=True, cache=True)
def _block(panels, p, phases, b_at, offsets, k, k0, k1, c, c_at, ldc, bias, mode, low, high, columns):
    """Panel ``p`` times the block of ``columns`` pixels whose row ``r`` starts at ``b_at +
    offsets[r]`` of ``phases``, over steps ``k0 .. k1`` of the ``k``, into ``c`` from ``c_at``
    (rows ``ldc`` apart): from the bias in the first block of steps, onto what ``c`` holds
    in the others, the activation by the last (as ``tiles._block``)."""
    at = (p * k + k0) * TILE_ROWS
    onto = np.int64(k0 > 0)
    act = mode if k1 == k else 0
    steps, bias_at = k1 - k0, p * TILE_ROWS
    ahead = np.int64(k * TILE_ROWS)  # the next panel's same steps
    if columns == TILE_COLUMNS:
        _offset_tile(
            panels, at, phases, b_at, offsets, k0, c, c_at, ldc, steps, bias, bias_at, act, low, high, onto,
            ahead,
        )  # fmt: skip
    elif columns <= LANES:
        _offset_narrow_tile_part(
            panels, at, phases, b_at, offsets, k0, c, c_at, ldc, steps, bias, bias_at, act, low, high, onto, ahead,
            columns,
        )  # fmt: skip
    else:
        _offset_tile_part(
            panels, at, phases, b_at, offsets, k0, c, c_at, ldc, steps, bias, bias_at, act, low, high, onto, ahead,
            columns,
        )  # fmt: skip


@njit(**NATIVE)
def _window_slice(
    task, n, bounds, phases, offsets, all_panels, all_bias, out, ow_count, pitch, code, alpha, beta
):
    """Image ``n``: task (group, pixel slice of ``bounds``), its pixels in blocks of at most
    ``TILE_COLUMNS`` within one output row (of ``ow_count``; the planes' rows are ``pitch``
    long), every panel of the group's weights over each block. ``out`` (N, M, pixels)."""
    g, s = divmod(task, bounds.shape[0] - 1)
    start, stop = bounds[s], bounds[s + 1]
    panels, bias, rows = all_panels[g], all_bias[g], offsets[g]
    m_count, pixels = out.shape[1], out.shape[2]
    mg = m_count // all_panels.shape[0]
    k = rows.shape[0]
    mode = RELU_MODE if code == RELU else CLIP_MODE if code == CLIP else 0
    low, high = np.float32(alpha), np.float32(beta)
    full = mg // TILE_ROWS
    depth = max(k, 1) if k <= DEPTH_MAX else -(-k // -(-k // DEPTH))
    scratch = np.empty((TILE_ROWS, TILE_COLUMNS), np.float32)
    flat = out.reshape(-1)
    first = (n * m_count + g * mg) * pixels  # the group's first output row
    other = mode == 0 and code != NONE
    curve_from = start  # pixels whose curve is still to apply, from here to q
    q = start
    while q < stop:
        oh = q // ow_count
        end = min(stop, (oh + 1) * ow_count)
        for b in range(q, end, TILE_COLUMNS):
            columns = min(TILE_COLUMNS, end - b)
            b_at = oh * pitch + b - oh * ow_count
            for k0 in range(0, max(k, 1), depth):  # an empty product: one block, the bias
                k1 = min(k, k0 + depth)
                for p in range(full):
                    c_at = first + p * TILE_ROWS * pixels + b
                    _block(
                        panels, p, phases, b_at, rows, k, k0, k1, flat, c_at, pixels, bias, mode, low, high, columns,
                    )  # fmt: skip
            if full * TILE_ROWS < mg:  # the last panel's padding rows go to scratch
                _block(
                    panels, full, phases, b_at, rows, k, 0, k, scratch, 0, TILE_COLUMNS, bias, mode, low, high,
                    columns,
                )  # fmt: skip
                for i in range(mg - full * TILE_ROWS):
                    at = np.uint64(first + (full * TILE_ROWS + i) * pixels + b)
                    for j in range(columns):
                        flat[at + np.uint64(j)] = scratch[i, j]
        q = end
        # another curve than Relu or a clip on the outputs stored, a block at a time, while
        # they are in L2 (as ``tiles.gemm_panels`` does)
        if other and (q == stop or (q - curve_from) * mg >= CURVE_BLOCK_FLOATS):
            for i in range(mg):
                at = first + i * pixels
                activate_in_place(flat[at + curve_from : at + q], code, alpha, beta)
            curve_from = q


_SPLIT_ROWS = SliceFunction(_split_rows)
_WINDOW_SLICE = SliceFunction(_window_slice)


def window_offsets(geo: np.ndarray, w_shape: tuple[int, ...], groups: int, shape: np.ndarray) -> np.ndarray:
    """Where row ``r`` of each group's GEMM operand starts in an image's phase planes
    (``shape``: their rows and pitch; a channel's ``sh * sw`` planes one after another):
    (groups, C / groups * kh * kw) int64, as ``phases.cell_offset`` places kernel cells."""
    kh, kw, sh, sw, dh, dw = (int(v) for v in geo[:6])
    rows, pitch = int(shape[0]), int(shape[1])
    plane = rows * pitch
    cg = w_shape[1]
    r = np.arange(cg * kh * kw)
    ki, kj = (r // kw) % kh, r % kw
    cell = ((ki * dh) % sh * sw + (kj * dw) % sw) * plane + (ki * dh // sh) * pitch + kj * dw // sw
    channels = np.arange(groups)[:, None] * cg + r[None, :] // (kh * kw)
    return np.ascontiguousarray(channels * sh * sw * plane + cell[None, :], np.int64)


def conv_by_windows(x, out, geo, bounds, offsets, panels, panel_bias, shape, code, alpha, beta):
    """Every image: its padded channels into phase planes (a run of them per task), then one
    task per (group, pixel slice of ``bounds``) by :func:`_window_slice`. ``out`` (N, M,
    pixels)."""
    sh, sw, ph, pw = geo[2], geo[3], geo[6], geo[7]
    rows, pitch = shape[0], shape[1]
    channels = x.shape[1]
    phases = np.empty(channels * int(sh * sw * rows * pitch), np.float32)
    chunks = min(int(rows), bounds.shape[0] - 1)
    split = (phases, x, rows, pitch, sh, sw, ph, pw, chunks)
    slices = (bounds, phases, offsets, panels, panel_bias, out, geo[9], pitch, code, alpha, beta)
    run_stages(
        x.shape[0],
        _SPLIT_ROWS.address(split),
        chunks,
        split,
        _WINDOW_SLICE.address(slices),
        panels.shape[0] * (bounds.shape[0] - 1),
        slices,
    )


@attrs.frozen(eq=False)
class Windows:
    """Plan of a strided conv by :func:`conv_by_windows`: ``bounds`` over each image's pixels,
    ``offsets`` of the GEMM's rows in the phase planes of ``shape`` (rows, pitch)."""

    name: ClassVar[str] = "windows"
    geo: np.ndarray
    bounds: np.ndarray
    offsets: np.ndarray
    shape: np.ndarray

    @classmethod
    def applies(cls, geometry: ConvGeometry, tuning: ConvTuning) -> bool:
        """A strided conv whose kernel spans its stride on both axes (its columns would come
        from phase planes), whose output rows are wider than a vector (a narrower row would
        be all narrow tiles, which load a weight per multiply-add: a 14-pixel row ran at 0.7x
        the column path's speed), whose dot products are at most ``tuning.windows_max_depth``
        long, whose weights the register tiles take, and whose pixels split over the workers
        as well as its output channels would."""
        return (
            bool(phase_shape(geometry)[0] > 0)
            and geometry.out_hw[1] > LANES
            and geometry.rows <= tuning.windows_max_depth
            and tuning.tiles(geometry.group_weights, geometry.rows)
            and geometry.balance(geometry.column_bounds(tuning))
            >= geometry.balance(geometry.row_bounds(tuning))
        )

    @classmethod
    def plan(cls, geometry: ConvGeometry, tuning: ConvTuning) -> Windows:
        """The pixels split over the workers; the rows' offsets in the phase planes."""
        geo, shape = geometry.geo(), phase_shape(geometry)
        offsets = window_offsets(geo, geometry.w_shape, geometry.groups, shape)
        return cls(geo, geometry.column_bounds(tuning), offsets, shape)

    def forms(self, weights: ConvWeights, w, w_shape, bias, constant: bool) -> None:
        """See ``algorithms.ConvAlgorithm``."""
        weights.panels(w, bias, constant)

    def run(
        self, weights: ConvWeights, x, w, w_shape, bias, out, finish: bool, constant: bool, act: ActArgs
    ) -> None:
        """See ``algorithms.ConvAlgorithm.run``."""
        panels, panel_bias = weights.panels(w, bias, constant)
        out_flat = out.reshape(*out.shape[:2], -1)
        conv_by_windows(
            x, out_flat, self.geo, self.bounds, self.offsets, panels, panel_bias, self.shape, *act
        )
