"""Depthwise Conv for CpuAcc (one input channel per group, NCHW): a direct sliding window over
a zero-padded copy of each input channel (split into phase planes when strided), one task per
(image, output channel) plane.
:class:`~flowrt.workers.cpu.acc.kernels.conv.ConvKernel` calls it for such convs.

The planes of depthwise layers are small (7x7 to 112x112), so what a plane costs besides its
taps counts: the copies in and out are plain loops over rows, the pad cells of the scratch are
zeroed once per slice (every plane leaves them untouched), and the activation is one pass
over the whole output run.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from flowrt.workers.cpu.acc.kernels.epilogue import NO_BIAS, activate_row


@njit(inline="always", nogil=True, cache=True)
def _source_shape(geo, height, width, oh_count, ow_count):
    """Rows and pitch of the padded plane (unit strides) or of each of its ``sh * sw`` phase
    planes (the pixels whose padded row and column are i and j modulo the strides)."""
    kh, kw, sh, sw, dh, dw, ph, pw = geo[0], geo[1], geo[2], geo[3], geo[4], geo[5], geo[6], geo[7]
    if sh == 1 and sw == 1:
        return max(ph + height, oh_count + (kh - 1) * dh), max(pw + width, ow_count + (kw - 1) * dw)
    return oh_count + (kh - 1) * dh // sh, ow_count + (kw - 1) * dw // sw


@njit(inline="always", nogil=True, cache=True)
def _fill_source(src, x, rows, pitch, sh, sw, ph, pw):
    """The input plane ``x`` into ``src`` as its zero-padded plane or phase planes, writing
    only the cells that come from ``x``: the pad cells are the same for every plane."""
    height, width = x.shape
    for i in range(sh):
        for j in range(sw):
            base = (i * sw + j) * rows * pitch
            # Column c of the phase plane reads input column j + c * sw - pw: in [0, width)
            # for c in [c_lo, c_hi).
            c_lo = min(pitch, max(0, -(-(pw - j) // sw)))
            c_hi = min(pitch, max(c_lo, -(-(width + pw - j) // sw)))
            first = j + c_lo * sw - pw
            r_lo = min(rows, max(0, -(-(ph - i) // sh)))
            r_hi = min(rows, max(r_lo, -(-(height + ph - i) // sh)))
            for r in range(r_lo, r_hi):
                line = x[i + r * sh - ph, first:]
                dst = src[base + r * pitch + c_lo : base + r * pitch + c_hi]
                if sw == 1:
                    for c in range(dst.shape[0]):
                        dst[c] = line[c]
                else:
                    for c in range(dst.shape[0]):
                        dst[c] = line[c * sw]


@njit(nogil=True, cache=True)
def _depthwise_plane(src, x, wm, b, out_plane, acc, geo, rows, pitch, code, alpha, beta):
    """One output plane of a depthwise conv from its input plane ``x``.

    Every tap is one long unit-stride loop over the flattened padded plane (or one of its
    phase planes) from a fixed offset: the output is computed on that plane's row pitch (a few
    columns per row too many, then dropped), which LLVM vectorizes. ``src`` is the scratch of
    the padded or phase planes, ``acc`` of the output run."""
    kh, kw, sh, sw, dh, dw, ph, pw = geo[0], geo[1], geo[2], geo[3], geo[4], geo[5], geo[6], geo[7]
    oh_count, ow_count = out_plane.shape
    _fill_source(src, x, rows, pitch, sh, sw, ph, pw)
    total = (oh_count - 1) * pitch + ow_count
    run = acc[:total]
    for i in range(total):
        run[i] = b
    for ki in range(kh):
        for kj in range(kw):
            wv = wm[ki, kj]
            p = ((ki * dh) % sh) * sw + (kj * dw) % sw
            start = p * rows * pitch + (ki * dh // sh) * pitch + kj * dw // sw
            tap = src[start : start + total]
            for i in range(total):
                run[i] += wv * tap[i]
    activate_row(run, run, NO_BIAS, code, alpha, beta)
    for oh in range(oh_count):
        row = out_plane[oh]
        line = run[oh * pitch : oh * pitch + ow_count]
        for ow in range(ow_count):
            row[ow] = line[ow]


@njit(parallel=True, nogil=True, cache=True)
def depthwise(x, w, bias, out, geo, code, alpha, beta, bounds):
    """Tasks are (image, output channel) planes, cut into slices by ``bounds``: a direct sliding
    window over a zero-padded copy of the input channel (output channel m reads input
    channel m // multiplier)."""
    sh, sw = geo[2], geo[3]
    channels, height, width = x.shape[1], x.shape[2], x.shape[3]
    m_count, oh_count, ow_count = out.shape[1], out.shape[2], out.shape[3]
    multiplier = m_count // channels
    rows, pitch = _source_shape(geo, height, width, oh_count, ow_count)
    for s in prange(bounds.shape[0] - 1):
        # scratch per slice: the padded or phase planes (pad cells stay zero) and the output run
        src = np.zeros(sh * sw * rows * pitch, np.float32)
        acc = np.empty(oh_count * pitch, np.float32)
        for task in range(bounds[s], bounds[s + 1]):
            n, m = divmod(task, m_count)
            _depthwise_plane(
                src, x[n, m // multiplier], w[m], bias[m], out[n, m], acc, geo, rows, pitch, code, alpha, beta
            )
