"""Conv as im2col and GEMM over one image at a time: split over column slices (output
pixels, :class:`Columns`) or, when there are too few pixels for every worker, over output
channels (GEMM rows, :class:`Rows`) of one shared column matrix.

Each column slice walks its columns in chunks: it copies the chunk's input windows into a
column buffer of its own (im2col) and multiplies the weights by it straight into the output
block, with bias and activation applied as the block is stored: by register tiles over
weights packed at load (``tiles.py``), or by BLAS for weights past
``tuning.TILES_MAX_WEIGHTS`` and on CPUs without AVX2. A 1x1 stride-1 unpadded conv reads its
input as the column matrix itself, and a strided conv copies its columns from the phase
planes of each image, split once (``im2col.im2col_phases``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

import attrs
import numpy as np
from numba import njit

from flowrt.workers.cpu.acc.blas import NATIVE, SliceFunction, call_native, gemm_at, run_stages
from flowrt.workers.cpu.acc.conv.finish import finish_row_late
from flowrt.workers.cpu.acc.conv.im2col import fill_address, fill_kind
from flowrt.workers.cpu.acc.conv.tuning import MIN_COLUMNS
from flowrt.workers.cpu.acc.phases import fill_phase_planes_late
from flowrt.workers.cpu.acc.tile_ir import TILE_COLUMNS
from flowrt.workers.cpu.acc.tiles import panels_address

if TYPE_CHECKING:
    from flowrt.workers.cpu.acc.conv.algorithms import ActArgs
    from flowrt.workers.cpu.acc.conv.geometry import ConvGeometry
    from flowrt.workers.cpu.acc.conv.tuning import ConvTuning
    from flowrt.workers.cpu.acc.conv.weights import ConvWeights

# What conv_by_columns is passed for its panels when it multiplies by BLAS.
_NO_PANELS = np.empty((0, 0, 0, 0), np.float32)
_NO_BIAS = np.empty((0, 0), np.float32)
# What conv_by_columns passes for the residual where there is none.
_NO_RESIDUAL = np.empty((0, 0, 0), np.float32)


@njit(inline="always", nogil=True, cache=True)
def _finish(out, r0, r1, q0, q1, bias, code, alpha, beta):
    """Bias (one per row) and the activation, in place, on rows ``r0 .. r1`` and columns
    ``q0 .. q1`` of one image's C-contiguous (channels, pixels) output. Rows are taken from
    that array itself: numba types a row of a 2-D slice as strided, and does not vectorize it."""
    for r in range(r0, r1):
        finish_row_late(out[r, q0:q1], bias[r], code, alpha, beta)


_ONE, _ZERO = np.float32(1), np.float32(0)


@njit(inline="always", nogil=True, cache=True)
def _address(a):
    """Where ``a``'s data starts, as an int64 (``ctypes.data`` is unsigned: a sum with a
    signed offset would be a float)."""
    return np.int64(a.ctypes.data)


# The slice work of both kernels is in SliceFunctions, which run_stages calls by address
# (see ``calls.py``): on a cold cache, the parallel loops around a body of im2col, GEMM and
# epilogue cost more to compile than the body itself. The slices call the im2col fill and
# the register-tile GEMM by address too: linked in, each would be compiled again into every
# kernel that calls it, and the fills a conv does not use would be compiled with it.


@njit(**NATIVE)
def _split_channels(task, n, phases, x, rows, pitch, sh, sw, ph, pw, chunks):
    """Image ``n``'s padded channels, the ``task``-th of ``chunks`` runs of them, into their
    phase planes, channel ``c``'s at ``phases[c * planes:]``."""
    planes = sh * sw * rows * pitch
    channels = x.shape[1]
    for c in range(task * channels // chunks, (task + 1) * channels // chunks):
        fill_phase_planes_late(
            phases[c * planes : (c + 1) * planes], x[n, c], rows, pitch, rows * pitch, sh, sw, ph, pw
        )


@njit(**NATIVE)
def _column_slice(
    task, n, bounds, x_flat, w, bias, out, z, geo, direct, chunk, finish, code, alpha, beta,
    panels, panel_bias, src, image, height, width, fill, multiply,
):  # fmt: skip
    """Image ``n``: task (group, column slice of ``bounds``), its columns in chunks (see
    :func:`conv_by_columns`); ``z``: a residual of ``out``'s shape to add (the tiles'
    ``multiply`` then ``tiles.gemm_panels_onto``), or empty."""
    mg, kg = w.shape[1], w.shape[2]
    channels, pixels_in = x_flat.shape[1], x_flat.shape[2]
    m_count, pixels = out.shape[1], out.shape[2]
    cg = channels // w.shape[0]
    g, s = divmod(task, bounds.shape[0] - 1)
    start, stop = bounds[s], bounds[s + 1]
    buffer = np.empty(0 if direct else kg * min(chunk, stop - start), np.float32)
    zero = np.int64(0)
    # BLAS reads the operands where they lie, by address (``blas.gemm_at``): no views
    w_at, x_at, out_at = _address(w), _address(x_flat), _address(out)
    for q0 in range(start, stop, chunk):
        q1 = min(q0 + chunk, stop)
        if not direct:
            # a C-contiguous (kg, q1 - q0) matrix, so that im2col's row copies vectorize
            call_native(
                fill, (src, n * image, g * cg, geo, height, width, zero, q0, buffer, zero, kg, q1 - q0)
            )
        if multiply:
            if direct:
                cols = x_flat[n, g * cg : (g + 1) * cg, q0:q1]
            else:
                cols = buffer[: kg * (q1 - q0)].reshape((kg, q1 - q0))
            block = out[n, g * mg : (g + 1) * mg, q0:q1]
            if z.shape[0] > 0:
                onto = z[n, g * mg : (g + 1) * mg, q0:q1]
                call_native(multiply, (panels[g], panel_bias[g], cols, block, onto, code, alpha, beta))
            else:
                call_native(multiply, (panels[g], panel_bias[g], cols, block, code, alpha, beta))
            continue
        if direct:
            b_at, ldb = x_at + ((n * channels + g * cg) * pixels_in + q0) * 4, pixels_in
        else:
            b_at, ldb = _address(buffer), q1 - q0
        c_at = out_at + ((n * m_count + g * mg) * pixels + q0) * 4
        gemm_at(zero, zero, mg, q1 - q0, kg, _ONE, w_at + g * mg * kg * 4, kg, b_at, ldb, _ZERO, c_at, pixels)
        if finish:
            _finish(out[n], g * mg, (g + 1) * mg, q0, q1, bias, code, alpha, beta)


_SPLIT_CHANNELS = SliceFunction(_split_channels)
_COLUMN_SLICE = SliceFunction(_column_slice)


def _source(x: np.ndarray, geo: np.ndarray, phases: np.ndarray, phase_shape) -> tuple:
    """What the im2col fill reads: ``(src, floats per image, height, width, fill address)``,
    from the phase planes when there are (one image's), else from ``x`` itself."""
    if phases.shape[0]:
        return phases, 0, int(phase_shape[0]), int(phase_shape[1]), fill_address("phases", phases, geo)
    src = x.reshape(-1)
    kind = fill_kind(geo, x.shape[3], False)
    return src, x.shape[1] * x.shape[2] * x.shape[3], x.shape[2], x.shape[3], fill_address(kind, src, geo)


def conv_by_columns(
    x, x_flat, w, bias, out, geo, direct, bounds, chunk, finish, code, alpha, beta, panels, panel_bias,
    phase_shape, z=None,
):  # fmt: skip
    """Every image; one task per (group, column slice), walking its columns in chunks. With
    ``panels`` (per group, :func:`~flowrt.workers.cpu.acc.tiles.pack_panels`; empty for BLAS)
    each chunk is multiplied by :func:`~flowrt.workers.cpu.acc.tiles.gemm_panels`, bias and
    activation included. A strided conv (``phase_shape`` the rows and pitch of its phase
    planes, else zeros) first splits each image's padded channels into phase planes, which
    its chunks' im2col then reads by unit-stride runs (:func:`~.im2col.im2col_phases`).
    ``z``: a residual of ``out``'s shape, added before the activation (by the tiles only)."""
    sh, sw, ph, pw = geo[2], geo[3], geo[6], geo[7]
    rows, pitch = phase_shape[0], phase_shape[1]
    channels = x.shape[1]
    planes = int(sh * sw * rows * pitch)  # per channel
    phases = np.zeros(channels * planes, np.float32)  # pad cells stay zero
    chunks = min(channels, bounds.shape[0] - 1)  # as many as there are slices
    split = (phases, x, rows, pitch, sh, sw, ph, pw, chunks)
    src, image, height, width, fill = (None, 0, 0, 0, 0) if direct else _source(x, geo, phases, phase_shape)
    multiply = panels_address(panels, panel_bias, z is not None) if panels.shape[0] else 0
    slices = (
        bounds, x_flat, w, bias, out, _NO_RESIDUAL if z is None else z, geo, direct, chunk, finish, code,
        alpha, beta, panels, panel_bias,
        phases if src is None else src, image, height, width, fill, multiply,
    )  # fmt: skip
    run_stages(
        x.shape[0],
        _SPLIT_CHANNELS.address(split) if planes else 0,
        chunks if planes else 0,
        split,
        _COLUMN_SLICE.address(slices),
        w.shape[0] * (bounds.shape[0] - 1),
        slices,
    )


@njit(**NATIVE)
def _column_rows(task, n, src, image, geo, height, width, columns, kg, cg, chunks, fill):
    """Rows of image ``n``'s column matrix (flat ``columns``, ``kg`` rows per group), the
    ``task``-th of ``chunks`` runs of them (see :func:`conv_by_rows`): runs, not single rows,
    since a row can be a few pixels long; one call of the fill per group in the run."""
    pixels = geo[8] * geo[9]
    total = columns.shape[0] // pixels
    r, stop = task * total // chunks, (task + 1) * total // chunks
    while r < stop:
        g, rg = divmod(r, kg)
        end = min(stop, (g + 1) * kg)
        at = r * pixels
        call_native(
            fill, (src, n * image, g * cg, geo, height, width, rg, np.int64(0), columns, at, end - r, pixels)
        )
        r = end


@njit(**NATIVE)
def _row_slice(task, n, row_bounds, x_flat, w, bias, out, columns, direct, finish, code, alpha, beta):
    """Image ``n``: task (group, output-channel slice of ``row_bounds``) (see
    :func:`conv_by_rows`)."""
    mg, kg = w.shape[1], w.shape[2]
    channels, pixels_in = x_flat.shape[1], x_flat.shape[2]
    m_count, pixels = out.shape[1], out.shape[2]
    cg = channels // w.shape[0]
    g, s = divmod(task, row_bounds.shape[0] - 1)
    m0, m1 = row_bounds[s], row_bounds[s + 1]
    r0, r1 = g * mg + m0, g * mg + m1
    # BLAS reads the operands where they lie, by address (``blas.gemm_at``): no views
    if direct:
        b_at, ldb = _address(x_flat) + (n * channels + g * cg) * pixels_in * 4, pixels_in
    else:
        b_at, ldb = _address(columns) + g * kg * pixels * 4, pixels
    a_at, c_at = _address(w) + r0 * kg * 4, _address(out) + (n * m_count + r0) * pixels * 4
    zero = np.int64(0)
    gemm_at(zero, zero, m1 - m0, pixels, kg, _ONE, a_at, kg, b_at, ldb, _ZERO, c_at, pixels)
    if finish:
        _finish(out[n], r0, r1, 0, out.shape[2], bias, code, alpha, beta)


_COLUMN_ROWS = SliceFunction(_column_rows)
_ROW_SLICE = SliceFunction(_row_slice)


def conv_by_rows(x, x_flat, w, bias, out, geo, direct, row_bounds, finish, code, alpha, beta):
    """Every image; its whole column matrix first (split over its rows), then one task per
    (group, output-channel slice)."""
    groups, kg = w.shape[0], w.shape[2]
    cg = x.shape[1] // groups
    columns = np.empty((0 if direct else groups * kg, out.shape[2]), np.float32)
    chunks = min(groups * kg, row_bounds.shape[0] - 1)  # as many as there are slices
    src = x.reshape(-1)
    address = 0 if direct else fill_address(fill_kind(geo, x.shape[3], False), src, geo)
    image = x.shape[1] * x.shape[2] * x.shape[3]
    fill = (src, image, geo, x.shape[2], x.shape[3], columns.reshape(-1), kg, cg, chunks, address)
    slices = (row_bounds, x_flat, w, bias, out, columns, direct, finish, code, alpha, beta)
    run_stages(
        x.shape[0],
        0 if direct else _COLUMN_ROWS.address(fill),
        0 if direct else chunks,
        fill,
        _ROW_SLICE.address(slices),
        groups * (row_bounds.shape[0] - 1),
        slices,
    )


def phase_shape(geometry: ConvGeometry) -> np.ndarray:
    """The rows and pitch of the phase planes a strided conv reads its windows from, where
    its kernel spans at least its stride on both axes; else zeros (a 1x1 stride-2 conv would
    split four planes to read one)."""
    g, kernel, (oh, ow) = geometry.window, geometry.kernel, geometry.out_hw
    phased = g.strides != (1, 1) and all(k * d >= st for k, d, st in zip(kernel, g.dilations, g.strides))
    if not phased:
        return np.zeros(2, np.int64)
    return np.array(
        [
            oh + (kernel[0] - 1) * g.dilations[0] // g.strides[0],
            ow + (kernel[1] - 1) * g.dilations[1] // g.strides[1],
        ],
        np.int64,
    )


@attrs.frozen(eq=False)
class Columns:
    """Plan of a conv by :func:`conv_by_columns`: ``bounds`` over each image's pixels, in
    chunks of ``chunk`` columns, by register tiles when ``tiles`` (else BLAS); ``phase_shape``
    the rows and pitch of a strided conv's phase planes (else zeros)."""

    name: ClassVar[str] = "columns"
    geo: np.ndarray
    direct: bool
    bounds: np.ndarray
    chunk: int
    tiles: bool
    phase_shape: np.ndarray

    @classmethod
    def applies(cls, geometry: ConvGeometry, tuning: ConvTuning) -> bool:
        """Splitting each image's pixels keeps the workers at least as busy as splitting its
        output channels."""
        return geometry.balance(geometry.column_bounds(tuning)) >= geometry.balance(
            geometry.row_bounds(tuning)
        )

    @classmethod
    def plan(cls, geometry: ConvGeometry, tuning: ConvTuning) -> Columns:
        """The pixels split over the workers; chunks that keep the column buffer near
        ``tuning.chunk_floats`` (whole tiles of columns when multiplying by tiles)."""
        tiles = tuning.tiles(geometry.group_weights, geometry.rows)
        chunk = max(
            min(MIN_COLUMNS, tuning.chunk_floats), tuning.chunk_floats // max(geometry.rows, geometry.mg)
        )
        if tiles:
            chunk = max(TILE_COLUMNS, chunk - chunk % TILE_COLUMNS)
        bounds = geometry.column_bounds(tuning)
        return cls(geometry.geo(), geometry.direct, bounds, chunk, tiles, phase_shape(geometry))

    @property
    def takes_residual(self) -> bool:
        """Whether a FusedConv's residual is added as the tiles store (by tiles, not BLAS)."""
        return self.tiles

    def forms(self, weights: ConvWeights, w, w_shape, bias, constant: bool) -> None:
        """See ``algorithms.ConvAlgorithm``."""
        if self.tiles:
            weights.panels(w, bias, constant)

    def run(
        self,
        weights: ConvWeights,
        x,
        w,
        w_shape,
        bias,
        out,
        finish: bool,
        constant: bool,
        act: ActArgs,
        residual: np.ndarray | None = None,
    ) -> None:
        """See ``algorithms.ConvAlgorithm.run``; ``residual``: a FusedConv's Z (by tiles only)."""
        panels, panel_bias = weights.panels(w, bias, constant) if self.tiles else (_NO_PANELS, _NO_BIAS)
        x_flat, out_flat = x.reshape(*x.shape[:2], -1), out.reshape(*out.shape[:2], -1)
        z = None if residual is None else residual.reshape(out_flat.shape)
        conv_by_columns(
            x, x_flat, w, bias, out_flat, self.geo, self.direct, self.bounds, self.chunk, finish, *act,
            panels, panel_bias, self.phase_shape, z,
        )  # fmt: skip


@attrs.frozen(eq=False)
class Rows:
    """Plan of a conv by :func:`conv_by_rows`: ``bounds`` over each group's output channels."""

    name: ClassVar[str] = "rows"
    geo: np.ndarray
    direct: bool
    bounds: np.ndarray

    @classmethod
    def applies(cls, geometry: ConvGeometry, tuning: ConvTuning) -> bool:
        """Every conv: the last algorithm tried."""
        return True

    @classmethod
    def plan(cls, geometry: ConvGeometry, tuning: ConvTuning) -> Rows:
        """The output channels split over the workers."""
        return cls(geometry.geo(), geometry.direct, geometry.row_bounds(tuning))

    def run(
        self, weights: ConvWeights, x, w, w_shape, bias, out, finish: bool, constant: bool, act: ActArgs
    ) -> None:
        """See ``algorithms.ConvAlgorithm.run``."""
        x_flat, out_flat = x.reshape(*x.shape[:2], -1), out.reshape(*out.shape[:2], -1)
        conv_by_rows(x, x_flat, w, bias, out_flat, self.geo, self.direct, self.bounds, finish, *act)
