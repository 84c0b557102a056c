"""A conv of few output pixels per image (the 7x7 and 14x14 stages of a CNN, and the strided
convs that downsample into them) by register tiles across its output channels.

The column tiles (``tile_ir.py``, :class:`~flowrt.workers.cpu.acc.conv.packed.Packed`) put the
pixels along the vectors: a 7x7 plane of 49 pixels fills three 16-column tiles and a fourth
that holds one, and each tile reads every panel of weights again. Here the product is
computed transposed, out^T = x^T w^T, as ONNX Runtime's NCHWc convs do: a tile is
``TILE_ROWS`` pixels by ``TILE_COLUMNS`` output channels
(:func:`~flowrt.workers.cpu.acc.tile_ir._column_tile`), the weights read from panels of
``TILE_COLUMNS`` output channels packed at load (``packed_gemm.column_panels``), the pixels
either packed a tile at a time first (``PACK_PANELS`` panels or more to pass over them) or
read in place down the input's columns, a few adjacent pixels of each channel per step (a
1x1 unpadded conv at stride 1 only: a strided conv's pixels are always packed, which picks
them out, and so are a wider kernel's, each pixel's column of taps in the packed weights'
order, zeros for pad cells: an im2col of a tile of pixels at a time). Each
panel is read once per image, all the image's pixels passing over it; the dot products are
summed in blocks of ``packed_gemm.DEPTH``. A panel's tiles land in a small buffer, copied into
the output's rows with the activation applied. The tasks are slices of the panels, and of
the pixels too where the panels are too few to share evenly among the threads (three panels,
two threads: each thread takes every panel over half the pixels).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

import attrs
import numpy as np
from numba import njit

from flowrt.engine.scheduler.window import SplitHint, split_bounds
from flowrt.workers.cpu.acc.blas import NATIVE, SliceFunction, run_tasks
from flowrt.workers.cpu.acc.kernels.epilogue import activate_in_place
from flowrt.workers.cpu.acc.packed_gemm import DEPTH
from flowrt.workers.cpu.acc.tile_ir import AVAILABLE, TILE_COLUMNS, TILE_ROWS, _column_tile

# Fewest panels (of TILE_COLUMNS output channels) a task multiplies for which it packs the
# pixels first. On one core of an AMD EPYC without AVX-512, 7x7 and 14x14 convs of 64 and 96
# output channels ran a third faster reading the input in place, those of 960 and 1280 ten
# per cent faster packed.
PACK_PANELS = 8

if TYPE_CHECKING:
    from flowrt.workers.cpu.acc.conv.algorithms import ActArgs
    from flowrt.workers.cpu.acc.conv.geometry import ConvGeometry
    from flowrt.workers.cpu.acc.conv.tuning import ConvTuning
    from flowrt.workers.cpu.acc.conv.weights import ConvWeights


@njit(inline="always", nogil=True, cache=True)
def _pack_rows(x, rows, first_pixel, pixels, k, stride):
    """Output pixels ``first_pixel .. + pixels`` of ``x`` (K, input pixels) into ``rows``
    (tiles, K, TILE_ROWS), a tile of them at a time, k-major; the last tile's missing pixels
    stay zero. ``stride`` (ow, sh, sw, input width): output pixel p reads input pixel
    (p // ow) * sh * width + (p % ow) * sw."""
    ow, sh, sw, width = stride[0], stride[1], stride[2], stride[3]
    for t in range(rows.shape[0]):
        for i in range(min(TILE_ROWS, pixels - t * TILE_ROWS)):
            p = first_pixel + t * TILE_ROWS + i
            at = p // ow * sh * width + p % ow * sw
            for j in range(k):
                rows[t, j, i] = x[j, at]


@njit(inline="always", nogil=True, cache=True)
def _pack_window_rows(x, rows, first_pixel, pixels, geo):
    """:func:`_pack_rows` for a kernel wider than 1x1 or padded: row ``c * kh * kw + ki * kw +
    kj`` of a pixel's column (the order of the packed weights' depth) is its tap (ki, kj) of
    channel c, left zero where the tap falls on a pad cell (``rows`` comes zeroed). ``geo``:
    the stride's four, then input height, kh, kw, dh, dw, top and left pads."""
    ow, sh, sw, width = geo[0], geo[1], geo[2], geo[3]
    height, kh, kw, dh, dw, ph, pw = geo[4], geo[5], geo[6], geo[7], geo[8], geo[9], geo[10]
    taps = kh * kw
    for t in range(rows.shape[0]):
        for i in range(min(TILE_ROWS, pixels - t * TILE_ROWS)):
            p = first_pixel + t * TILE_ROWS + i
            top, left = p // ow * sh - ph, p % ow * sw - pw
            for ki in range(kh):
                y = top + ki * dh
                if 0 <= y < height:
                    for kj in range(kw):
                        column = left + kj * dw
                        if 0 <= column < width:
                            at = y * width + column
                            for c in range(x.shape[0]):
                                rows[t, c * taps + ki * kw + kj, i] = x[c, at]


@njit(**NATIVE)
def _few_pixels_task(task, _step, x_flat, panels, bias, out, bounds, tile_bounds, stride, code, alpha, beta):
    """Task (image, slice of ``bounds`` over the panels, slice of ``tile_bounds`` over the
    tiles of pixels) of :func:`conv_few_pixels`."""
    k, pixels = panels.shape[1], out.shape[2]  # the depth: channels x kernel taps
    m = out.shape[1]
    window = stride[11] != 0  # a kernel wider than 1x1, or pads: its pixels are packed by taps
    tile_slices = tile_bounds.shape[0] - 1
    image, s = divmod(task, (bounds.shape[0] - 1) * tile_slices)
    s, r = divmod(s, tile_slices)
    q0, q1 = bounds[s], bounds[s + 1]
    t0, t1 = tile_bounds[r], tile_bounds[r + 1]
    p0, p1 = t0 * TILE_ROWS, min(t1 * TILE_ROWS, pixels)
    x = x_flat[image]
    tiles = -(-pixels // TILE_ROWS)
    # With enough panels to pass over them, the pixels are first packed a tile of rows at a
    # time (the last tile zero-padded), so that a tile's step reads TILE_ROWS adjacent values
    # and the tiles stream in order; with few, the copy costs more than it saves, and the
    # tiles read the input in place (the last, short tile from a padded copy of its rows),
    # where its pixels are the output's (stride 1).
    packed = q1 - q0 >= PACK_PANELS or stride[1] != 1 or stride[2] != 1 or window
    rows = np.zeros((t1 - t0 if packed else 1, k, TILE_ROWS), np.float32)
    first_tail = tiles - 1 if pixels % TILE_ROWS else tiles
    if window:
        _pack_window_rows(x, rows, p0, p1 - p0, stride)
    elif packed:
        _pack_rows(x, rows, p0, p1 - p0, k, stride)
    elif first_tail < t1:
        _pack_rows(x, rows, first_tail * TILE_ROWS, pixels - first_tail * TILE_ROWS, k, stride)
    c = np.empty(((t1 - t0) * TILE_ROWS, TILE_COLUMNS), np.float32)
    flat = out.reshape(-1)
    for q in range(q0, q1):
        for k0 in range(0, k, DEPTH):
            depth = min(DEPTH, k - k0)
            onto = 1 if k0 > 0 else 0
            b_at = (q * k + k0) * TILE_COLUMNS
            for t in range(t0, t1):
                c_at = (t - t0) * TILE_ROWS * TILE_COLUMNS
                if packed or t == first_tail:
                    at = ((t - t0 if packed else 0) * k + k0) * TILE_ROWS
                    _column_tile(
                        rows, at, TILE_ROWS, panels, b_at, TILE_COLUMNS, c, c_at, TILE_COLUMNS, depth, bias,
                        q * TILE_COLUMNS, 0, onto,
                    )  # fmt: skip
                else:
                    _column_tile(
                        x, k0 * pixels + t * TILE_ROWS, pixels, panels, b_at, TILE_COLUMNS, c, c_at,
                        TILE_COLUMNS, depth, bias, q * TILE_COLUMNS, 0, onto,
                    )  # fmt: skip
        # The activation over the panel's tiles at once, before they are spread over the
        # output's rows: a row's 49 pixels (7x7) were too few for the vectorized loop, and
        # each ran one value at a time (HardSwish on a 96 -> 576 conv at 7x7: 70 us of 130).
        activate_in_place(c[: p1 - p0].reshape(-1), code, alpha, beta)
        # into the output's rows by flat index: a view of each row cost 10-35 ns, and a
        # 160 -> 960 conv at 7x7 stores 960 rows of 49 pixels
        for j in range(min(TILE_COLUMNS, m - q * TILE_COLUMNS)):
            at = np.uint64(((image * m) + q * TILE_COLUMNS + j) * pixels)
            for i in range(p0, p1):
                flat[at + np.uint64(i)] = c[i - p0, j]


_FEW_PIXELS_TASK = SliceFunction(_few_pixels_task)


def conv_few_pixels(x_flat, panels, bias, out, bounds, tile_bounds, stride, code, alpha, beta) -> None:
    """``out`` (N, M, pixels) = activation(w @ x + bias) for every image of ``x_flat`` (N, C,
    input pixels) read at ``stride`` (see :class:`FewPixels`), ``w`` packed as panels of
    output channels (``packed_gemm.column_panels`` of its transpose) and ``bias`` padded to
    them; one task per (image, slice of ``bounds`` over the panels, slice of ``tile_bounds``
    over the tiles of pixels), called by address (``blas.run_tasks``)."""
    args = (x_flat, panels, bias, out, bounds, tile_bounds, stride, code, alpha, beta)
    tasks = x_flat.shape[0] * (bounds.shape[0] - 1) * (tile_bounds.shape[0] - 1)
    run_tasks(_FEW_PIXELS_TASK.address(args), tasks, args)


def _split(panels: int, tiles: int, workers: int) -> tuple[int, int]:
    """How many slices of the panels and of the pixels' tiles ``workers`` threads take: the
    pair whose largest task is smallest, the panels' split where they tie (each task then
    reads every pixel, not every weight)."""
    best, largest = (1, 1), 1.0
    for by_panels in range(workers, 0, -1):
        by_tiles = workers // by_panels
        share = (-(-panels // by_panels) / panels) * (-(-tiles // by_tiles) / tiles)
        if share < largest - 1e-9:
            best, largest = (by_panels, by_tiles), share
    return best


def _pixels_split_unevenly(geometry: ConvGeometry, tuning: ConvTuning) -> bool:
    """Whether the images' pixels, split as the column tiles split them, keep the workers
    less busy than the output channels split as BLAS's rows (so the column tiles do not
    take the conv: ``Packed.applies``, ``Columns.applies``)."""
    return geometry.balance(geometry.batch_bounds(tuning)) < geometry.balance(geometry.row_bounds(tuning))


@attrs.frozen(eq=False)
class FewPixels:
    """Plan of a conv of one group and few output pixels per image (see :meth:`applies`) by
    :func:`conv_few_pixels`: ``bounds`` over the panels of output channels, and where its
    output pixels are in the input (``stride``: ow, sh, sw, width, then height, kh, kw, dh,
    dw, top and left pads, and whether the pixels are packed by taps)."""

    name: ClassVar[str] = "few_pixels"
    bounds: np.ndarray
    tile_bounds: np.ndarray
    stride: np.ndarray

    @classmethod
    def applies(cls, geometry: ConvGeometry, tuning: ConvTuning) -> bool:
        """A conv (any kernel, stride, dilation and pads) of one group, where the tiles run at
        all (``tuning.tiles_max_weights`` not negative; each panel is read once an image, so
        the weights' size does not count), of at least a tile's rows of pixels per image
        (fewer: :class:`~flowrt.workers.cpu.acc.conv.vector.Vector` takes them) and at most
        ``tuning.few_pixels_max``; a 1x1 unpadded one also up to ``tuning.few_pixels_deep_max``
        where the column tiles would leave the product to BLAS: its depth past
        ``tuning.tiles_max_depth``, or its pixels too few to split evenly over the workers
        (then the output channels are split, by BLAS: squeezenet's 1x1 convs at 13x13 on two
        threads, 169 pixels, fewer than two slices of ``tuning.column_hint``; on an AVX-512
        AMD EPYC, a 512 -> 1000 one took 750 us by BLAS, 500 here). A wider kernel, or pads,
        takes more than ``tuning.taps_max_rows`` output channels (fewer run tap by tap,
        1.1-1.7x faster at 7x7). (On one core of an AMD EPYC without AVX-512, 3x3 convs of
        7x7 planes of 48 to 512 channels ran 5-25% faster than by the column tiles or BLAS, a
        5x5 one 10-15%; 14x14 ones strided from 28x28 no faster.)"""
        pixels, pointwise = geometry.pixels, geometry.pointwise
        return (
            AVAILABLE
            and geometry.groups == 1
            and tuning.tiles_max_weights >= 0
            and TILE_ROWS <= pixels
            and (pointwise or geometry.mg > tuning.taps_max_rows)
            and (
                pixels <= tuning.few_pixels_max
                or (
                    pointwise
                    and pixels <= tuning.few_pixels_deep_max
                    and (geometry.rows > tuning.tiles_max_depth or _pixels_split_unevenly(geometry, tuning))
                )
            )
        )

    @classmethod
    def plan(cls, geometry: ConvGeometry, tuning: ConvTuning) -> FewPixels:
        """The panels of output channels split over the workers, or the tiles of pixels too
        where the panels are too few to share evenly (:func:`_split`)."""
        panels = -(-geometry.mg // TILE_COLUMNS)
        tiles = -(-geometry.pixels // TILE_ROWS)
        by_panels, by_tiles = _split(panels, tiles, geometry.workers)
        hint = SplitHint(axis=1, min_slice=1)
        bounds = split_bounds(panels, hint, by_panels).astype(np.int64)
        tile_bounds = split_bounds(tiles, hint, by_tiles).astype(np.int64)
        g = geometry.window
        stride = np.array(
            [
                geometry.out_hw[1], *g.strides, geometry.x_shape[3], geometry.x_shape[2],
                *geometry.kernel, *g.dilations, *g.pads_begin,
                not geometry.pointwise,
            ],
            np.int64,
        )  # fmt: skip
        return cls(bounds, tile_bounds, stride)

    def forms(self, weights: ConvWeights, w, w_shape, bias, constant: bool) -> None:
        """See ``algorithms.ConvAlgorithm``."""
        weights.column_panels(w, bias, constant)

    def run(
        self, weights: ConvWeights, x, w, w_shape, bias, out, finish: bool, constant: bool, act: ActArgs
    ) -> None:
        """See ``algorithms.ConvAlgorithm.run``."""
        panels, panel_bias = weights.column_panels(w, bias, constant)
        x_flat, out_flat = x.reshape(*x.shape[:2], -1), out.reshape(*out.shape[:2], -1)
        conv_few_pixels(
            x_flat, panels, panel_bias, out_flat, self.bounds, self.tile_bounds, self.stride, *act
        )
