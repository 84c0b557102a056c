"""Conv as im2col and GEMM over one image at a time: split over column slices (output
pixels) or, when there are too few pixels for every worker, over output channels (GEMM
rows) of one shared column matrix. ``conv.py`` plans which runs and passes the split."""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from flowrt.workers.cpu.acc.blas import sgemm
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


@njit(nogil=True, cache=True)
def _split_channel(phases, c, planes, x_plane, rows, pitch, sh, sw, ph, pw):
    """Channel ``c``'s padded plane into its phase planes, at ``phases[c * planes:]``."""
    fill_phase_planes(
        phases[c * planes : (c + 1) * planes], x_plane, rows, pitch, rows * pitch, sh, sw, ph, pw
    )


@njit(parallel=True, nogil=True, cache=True)
def conv_by_columns(
    x,
    x_flat,
    w,
    bias,
    out,
    geo,
    direct,
    bounds,
    chunk,
    finish,
    code,
    alpha,
    beta,
    panels,
    panel_bias,
    phase_shape,
):
    """Every image; one task per (group, column slice), walking its columns in chunks. With
    ``panels`` (per group, :func:`~flowrt.workers.cpu.acc.tiles.pack_panels`; empty for BLAS)
    each chunk is multiplied by :func:`~flowrt.workers.cpu.acc.tiles.gemm_panels`, bias and
    activation included. A strided conv (``phase_shape`` the rows and pitch of its phase
    planes, else zeros) first splits each image's padded channels into phase planes, which
    its chunks' im2col then reads by unit-stride runs (:func:`im2col_phases`)."""
    tiles = panels.shape[0] > 0
    groups, mg, kg = w.shape
    channels = x.shape[1]
    cg = channels // groups
    slices = bounds.shape[0] - 1
    sh, sw, ph, pw = geo[2], geo[3], geo[6], geo[7]
    rows, pitch = phase_shape[0], phase_shape[1]
    planes = sh * sw * rows * pitch  # per channel
    phases = np.zeros(channels * planes, np.float32)  # pad cells stay zero
    for n in range(x.shape[0]):
        if planes:
            for c in prange(channels):
                _split_channel(phases, c, planes, x[n, c], rows, pitch, sh, sw, ph, pw)
        for task in prange(groups * slices):
            g, s = divmod(np.int64(task), slices)
            start, stop = bounds[s], bounds[s + 1]
            buffer = np.empty(0 if direct else kg * min(chunk, stop - start), np.float32)
            for q0 in range(start, stop, chunk):
                q1 = min(q0 + chunk, stop)
                if direct:
                    cols = x_flat[n, g * cg : (g + 1) * cg, q0:q1]
                else:
                    # a C-contiguous (kg, q1 - q0) matrix, so that im2col's row copies vectorize
                    cols = buffer[: kg * (q1 - q0)].reshape((kg, q1 - q0))
                    if planes:
                        im2col_phases(phases, g * cg, geo, rows, pitch, 0, q0, cols)
                    else:
                        fill_columns(x[n], x_flat[n], g * cg, geo, 0, q0, cols)
                block = out[n, g * mg : (g + 1) * mg, q0:q1]
                if tiles:
                    gemm_panels(panels[g], panel_bias[g], cols, block, code, alpha, beta)
                    continue
                sgemm(False, False, 1.0, w[g], cols, 0.0, block)
                if finish:
                    _finish(out[n], g * mg, (g + 1) * mg, q0, q1, bias, code, alpha, beta)


@njit(parallel=True, nogil=True, cache=True)
def conv_by_rows(x, x_flat, w, bias, out, geo, direct, row_bounds, finish, code, alpha, beta):
    """Every image; its whole column matrix first (split over its rows), then one task per
    (group, output-channel slice)."""
    groups, mg, kg = w.shape
    cg = x.shape[1] // groups
    pixels = out.shape[2]
    slices = row_bounds.shape[0] - 1
    columns = np.empty((0 if direct else groups * kg, pixels), np.float32)
    for n in range(x.shape[0]):
        if not direct:
            for r in prange(groups * kg):
                g, rg = divmod(np.int64(r), kg)
                fill_columns(x[n], x_flat[n], g * cg, geo, rg, 0, columns[r : r + 1])
        for task in prange(groups * slices):
            g, s = divmod(np.int64(task), slices)
            r0, r1 = g * mg + row_bounds[s], g * mg + row_bounds[s + 1]
            if direct:
                cols = x_flat[n, g * cg : (g + 1) * cg]
            else:
                cols = columns[g * kg : (g + 1) * kg]
            block = out[n, r0:r1]
            sgemm(False, False, 1.0, w[g, row_bounds[s] : row_bounds[s + 1]], cols, 0.0, block)
            if finish:
                _finish(out[n], r0, r1, 0, pixels, bias, code, alpha, beta)
