"""Conv as im2col and GEMM over one image at a time: split over column slices (output
pixels) or, when there are too few pixels for every worker, over output channels (GEMM
rows) of one shared column matrix. ``conv.py`` plans which runs and passes the split."""

from __future__ import annotations

import numpy as np
from numba import njit

from flowrt.workers.cpu.acc.blas import SliceFunction, run_stages, sgemm
from flowrt.workers.cpu.acc.kernels.epilogue import activate_row
from flowrt.workers.cpu.acc.kernels.im2col import fill_columns, im2col_phases
from flowrt.workers.cpu.acc.kernels.phases import fill_phase_planes
from flowrt.workers.cpu.acc.tiles import gemm_panels


@njit(inline="always", nogil=True, cache=True)
def _finish(out, r0, r1, q0, q1, bias, code, alpha, beta):
    """Bias (one per row) and the activation, in place, on rows ``r0 .. r1`` and columns
    ``q0 .. q1`` of one image's C-contiguous (channels, pixels) output. Rows are taken from
    that array itself: numba types a row of a 2-D slice as strided, and does not vectorize it."""
    for r in range(r0, r1):
        row = out[r, q0:q1]
        activate_row(row, row, bias[r], code, alpha, beta)


# The slice work of both kernels is in SliceFunctions, which run_stages calls by address
# (see ``blas.py``): on a cold cache, the parallel loops around a body of im2col, GEMM and
# epilogue cost more to compile than the body itself.


@njit(nogil=True, cache=True)
def _split_channels(task, n, phases, x, rows, pitch, sh, sw, ph, pw, chunks):
    """Image ``n``'s padded channels, the ``task``-th of ``chunks`` runs of them, into their
    phase planes, channel ``c``'s at ``phases[c * planes:]``."""
    planes = sh * sw * rows * pitch
    channels = x.shape[1]
    for c in range(task * channels // chunks, (task + 1) * channels // chunks):
        fill_phase_planes(
            phases[c * planes : (c + 1) * planes], x[n, c], rows, pitch, rows * pitch, sh, sw, ph, pw
        )


@njit(nogil=True, cache=True)
def _column_slice(
    task, n, bounds, x, x_flat, w, bias, out, geo, direct, chunk, finish, code, alpha, beta,
    panels, panel_bias, phases, rows, pitch,
):  # fmt: skip
    """Image ``n``: task (group, column slice of ``bounds``), its columns in chunks (see
    :func:`conv_by_columns`)."""
    mg, kg = w.shape[1], w.shape[2]
    cg = x.shape[1] // w.shape[0]
    g, s = divmod(task, bounds.shape[0] - 1)
    start, stop = bounds[s], bounds[s + 1]
    buffer = np.empty(0 if direct else kg * min(chunk, stop - start), np.float32)
    for q0 in range(start, stop, chunk):
        q1 = min(q0 + chunk, stop)
        if direct:
            cols = x_flat[n, g * cg : (g + 1) * cg, q0:q1]
        else:
            # a C-contiguous (kg, q1 - q0) matrix, so that im2col's row copies vectorize
            cols = buffer[: kg * (q1 - q0)].reshape((kg, q1 - q0))
            if phases.shape[0]:
                im2col_phases(phases, g * cg, geo, rows, pitch, np.int64(0), q0, cols)
            else:
                fill_columns(x[n], x_flat[n], g * cg, geo, np.int64(0), q0, cols)
        block = out[n, g * mg : (g + 1) * mg, q0:q1]
        if panels.shape[0] > 0:
            gemm_panels(panels[g], panel_bias[g], cols, block, code, alpha, beta)
            continue
        sgemm(False, False, 1.0, w[g], cols, 0.0, block)
        if finish:
            _finish(out[n], g * mg, (g + 1) * mg, q0, q1, bias, code, alpha, beta)


_SPLIT_CHANNELS = SliceFunction(_split_channels)
_COLUMN_SLICE = SliceFunction(_column_slice)


def conv_by_columns(
    x, x_flat, w, bias, out, geo, direct, bounds, chunk, finish, code, alpha, beta, panels, panel_bias,
    phase_shape,
):  # fmt: skip
    """Every image; one task per (group, column slice), walking its columns in chunks. With
    ``panels`` (per group, :func:`~flowrt.workers.cpu.acc.tiles.pack_panels`; empty for BLAS)
    each chunk is multiplied by :func:`~flowrt.workers.cpu.acc.tiles.gemm_panels`, bias and
    activation included. A strided conv (``phase_shape`` the rows and pitch of its phase
    planes, else zeros) first splits each image's padded channels into phase planes, which
    its chunks' im2col then reads by unit-stride runs (:func:`im2col_phases`)."""
    sh, sw, ph, pw = geo[2], geo[3], geo[6], geo[7]
    rows, pitch = phase_shape[0], phase_shape[1]
    channels = x.shape[1]
    planes = int(sh * sw * rows * pitch)  # per channel
    phases = np.zeros(channels * planes, np.float32)  # pad cells stay zero
    chunks = min(channels, bounds.shape[0] - 1)  # as many as there are slices
    split = (phases, x, rows, pitch, sh, sw, ph, pw, chunks)
    slices = (
        bounds, x, x_flat, w, bias, out, geo, direct, chunk, finish, code, alpha, beta, panels, panel_bias,
        phases, rows, pitch,
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


@njit(nogil=True, cache=True)
def _column_rows(task, n, x, x_flat, geo, columns, kg, cg, chunks):
    """Rows of image ``n``'s column matrix, the ``task``-th of ``chunks`` runs of them (see
    :func:`conv_by_rows`): runs, not single rows, since a row can be a few pixels long."""
    total = columns.shape[0]
    for r in range(task * total // chunks, (task + 1) * total // chunks):
        g, rg = divmod(r, kg)
        fill_columns(x[n], x_flat[n], g * cg, geo, rg, np.int64(0), columns[r : r + 1])


@njit(nogil=True, cache=True)
def _row_slice(task, n, row_bounds, x_flat, w, bias, out, columns, direct, finish, code, alpha, beta):
    """Image ``n``: task (group, output-channel slice of ``row_bounds``) (see
    :func:`conv_by_rows`)."""
    mg, kg = w.shape[1], w.shape[2]
    cg = x_flat.shape[1] // w.shape[0]
    g, s = divmod(task, row_bounds.shape[0] - 1)
    m0, m1 = row_bounds[s], row_bounds[s + 1]
    r0, r1 = g * mg + m0, g * mg + m1
    # Operands typed as conv_by_columns' are (strided 'A' views; weights read-only), so that
    # both ask for one specialization of sgemm.
    if direct:
        cols = x_flat[n, g * cg : (g + 1) * cg, :]
    else:
        cols = columns[g * kg : (g + 1) * kg, :]
    sgemm(False, False, 1.0, w[g, m0:m1], cols, 0.0, out[n, r0:r1, :])
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
    fill = (x, x_flat, geo, columns, kg, cg, chunks)
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
