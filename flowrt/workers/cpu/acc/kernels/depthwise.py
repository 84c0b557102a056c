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
from flowrt.workers.cpu.acc.kernels.phases import copy_run, fill_phase_planes


@njit(inline="always", nogil=True, cache=True)
def _source_shape(geo, height, width, oh_count, ow_count):
    """Rows and pitch of the padded plane (unit strides) or of each of its ``sh * sw`` phase
    planes (the pixels whose padded row and column are i and j modulo the strides)."""
    kh, kw, sh, sw, dh, dw, ph, pw = geo[0], geo[1], geo[2], geo[3], geo[4], geo[5], geo[6], geo[7]
    if sh == 1 and sw == 1:
        return max(ph + height, oh_count + (kh - 1) * dh), max(pw + width, ow_count + (kw - 1) * dw)
    return oh_count + (kh - 1) * dh // sh, ow_count + (kw - 1) * dw // sw


@njit(inline="always", nogil=True, cache=True)
def _tap_start(geo, rows, pitch, ki, kj):
    """Where kernel tap (ki, kj) starts reading the phase planes (the padded plane itself at
    unit strides): its phase plane's offset plus its row and column within that plane."""
    sh, sw, dh, dw = geo[2], geo[3], geo[4], geo[5]
    phase = ((ki * dh) % sh) * sw + (kj * dw) % sw
    return phase * rows * pitch + (ki * dh // sh) * pitch + kj * dw // sw


@njit(inline="always", nogil=True, cache=True)
def _row_taps(dst, first, w0, w1, w2, left, middle, right, n):
    """``dst[i] = first + taps`` (``first`` a float: the bias) or ``dst[i] += taps`` (None),
    the taps being one kernel row's ``w0 * left[i] + w1 * middle[i] + w2 * right[i]``: a loop
    of four arrays, which LLVM vectorizes (with all nine taps in one loop it stays scalar)."""
    if first is None:
        for i in range(n):
            dst[i] += w0 * left[i] + w1 * middle[i] + w2 * right[i]
    else:
        for i in range(n):
            dst[i] = first + (w0 * left[i] + w1 * middle[i] + w2 * right[i])


@njit(nogil=True, cache=True)
def _depthwise_plane(src, x, wm, b, out_plane, acc, geo, rows, pitch, code, alpha, beta):
    """One output plane of a depthwise conv from its input plane ``x``.

    Every tap is one long unit-stride loop over the flattened padded plane (or one of its
    phase planes) from a fixed offset, and a 3-wide kernel row's taps share one loop: the
    output is computed on that plane's row pitch (a few columns per row too many, then
    dropped), which LLVM vectorizes. ``src`` is the scratch of
    the padded or phase planes, ``acc`` of the output run."""
    kh, kw, sh, sw, ph, pw = geo[0], geo[1], geo[2], geo[3], geo[6], geo[7]
    oh_count, ow_count = out_plane.shape
    fill_phase_planes(src, x, rows, pitch, rows * pitch, sh, sw, ph, pw)
    total = (oh_count - 1) * pitch + ow_count
    run = acc[:total]
    if kw == 3:  # a kernel row's three taps in one loop (_row_taps), the bias with the first
        for ki in range(kh):
            s0 = _tap_start(geo, rows, pitch, ki, 0)
            s1 = _tap_start(geo, rows, pitch, ki, 1)
            s2 = _tap_start(geo, rows, pitch, ki, 2)
            w0, w1, w2 = wm[ki, 0], wm[ki, 1], wm[ki, 2]
            if ki == 0:
                _row_taps(run, b, w0, w1, w2, src[s0:], src[s1:], src[s2:], total)
            else:
                _row_taps(run, None, w0, w1, w2, src[s0:], src[s1:], src[s2:], total)
    else:
        for i in range(total):
            run[i] = b
        for ki in range(kh):
            for kj in range(kw):
                wv = wm[ki, kj]
                start = _tap_start(geo, rows, pitch, ki, kj)
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


@njit(inline="always", nogil=True, cache=True)
def _bordered(x, width, middle, left, right):
    """A flattened plane ``x`` into the scratches' middles (each has ``width + 1`` zeros
    before and after it): as it is, with its last column zeroed (what a left tap reads: the
    cell before column 0 is the row above's last) and with its first column zeroed (what a
    right tap reads). Three plain copies, then a store per row."""
    n = x.shape[0]
    at = width + 1
    copy_run(middle[at : at + n], x)
    copy_run(left[at : at + n], x)
    copy_run(right[at : at + n], x)
    zero = np.float32(0)
    for r in range(n // width):
        left[at + r * width + width - 1] = zero
        right[at + r * width] = zero


@njit(nogil=True, cache=True)
def _same3_plane(x, wm, b, o, width, middle, left, right, code, alpha, beta):
    """One output plane ``o`` of a 3x3 depthwise conv with unit strides and one pad cell on
    every side, both planes flattened. Output ``i`` reads the scratches at ``width + 1 + i``
    plus a row and column offset: every tap is one loop over the whole plane, and the zeros
    around and the zeroed columns stand for the pad cells (no per-row or border cases)."""
    n = x.shape[0]
    _bordered(x, width, middle, left, right)
    down = 2 * width
    _row_taps(o, b, wm[0, 0], wm[0, 1], wm[0, 2], left, middle[1:], right[2:], n)
    _row_taps(o, None, wm[1, 0], wm[1, 1], wm[1, 2], left[width:], middle[width + 1 :], right[width + 2 :], n)
    _row_taps(o, None, wm[2, 0], wm[2, 1], wm[2, 2], left[down:], middle[down + 1 :], right[down + 2 :], n)
    activate_row(o, o, NO_BIAS, code, alpha, beta)


@njit(parallel=True, nogil=True, cache=True)
def depthwise_same3(x, w, bias, out, code, alpha, beta, bounds):
    """:func:`depthwise` for a 3x3 kernel, unit strides and dilations and one pad cell on each
    side (the output planes have the input's shape), on C-contiguous ``x`` and ``out``: each
    plane by :func:`_same3_plane`, on scratches of the slice."""
    channels, height, width = x.shape[1], x.shape[2], x.shape[3]
    m_count = out.shape[1]
    multiplier = m_count // channels
    pixels = height * width
    for s in prange(bounds.shape[0] - 1):
        # zero borders of width + 1 cells on both sides, which the planes leave untouched
        size = pixels + 2 * (width + 1)
        middle = np.zeros(size, np.float32)
        left = np.zeros(size, np.float32)
        right = np.zeros(size, np.float32)
        for task in range(bounds[s], bounds[s + 1]):
            n, m = divmod(task, m_count)
            _same3_plane(
                x[n, m // multiplier].reshape(pixels),
                w[m],
                bias[m],
                out[n, m].reshape(pixels),
                width,
                middle,
                left,
                right,
                code,
                alpha,
                beta,
            )
