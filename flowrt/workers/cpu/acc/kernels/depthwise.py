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
from flowrt.workers.cpu.acc.kernels.phases import fill_phase_planes


@njit(inline="always", nogil=True, cache=True)
def _source_shape(geo, height, width, oh_count, ow_count):
    """Rows and pitch of the padded plane (unit strides) or of each of its ``sh * sw`` phase
    planes (the pixels whose padded row and column are i and j modulo the strides)."""
    kh, kw, sh, sw, dh, dw, ph, pw = geo[0], geo[1], geo[2], geo[3], geo[4], geo[5], geo[6], geo[7]
    if sh == 1 and sw == 1:
        return max(ph + height, oh_count + (kh - 1) * dh), max(pw + width, ow_count + (kw - 1) * dw)
    return oh_count + (kh - 1) * dh // sh, ow_count + (kw - 1) * dw // sw


@njit(nogil=True, cache=True)
def _depthwise_plane(src, x, wm, b, out_plane, acc, geo, rows, pitch, code, alpha, beta):
    """One output plane of a depthwise conv from its input plane ``x``.

    Every tap is one long unit-stride loop over the flattened padded plane (or one of its
    phase planes) from a fixed offset: the output is computed on that plane's row pitch (a few
    columns per row too many, then dropped), which LLVM vectorizes. ``src`` is the scratch of
    the padded or phase planes, ``acc`` of the output run."""
    kh, kw, sh, sw, dh, dw, ph, pw = geo[0], geo[1], geo[2], geo[3], geo[4], geo[5], geo[6], geo[7]
    oh_count, ow_count = out_plane.shape
    fill_phase_planes(src, x, rows, pitch, rows * pitch, sh, sw, ph, pw)
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


@njit(inline="always", nogil=True, cache=True)
def _three(w0, w1, w2, row, i):
    """One kernel row's weights on ``row[i : i + 3]``."""
    return w0 * row[i] + w1 * row[i + 1] + w2 * row[i + 2]


@njit(nogil=True, cache=True)
def _same3_rows(o, x, lo, hi, up, down, b, wm, width):
    """``o[lo:hi]`` of a 3x3 unit-stride depthwise plane on the flattened planes: the bias and
    the taps of the middle kernel row, of the one above when ``up``, below when ``down``.
    Each kernel row reads three neighbours of one slice of ``x``, and each case is a loop of
    its own with no branch inside, so the loops vectorize."""
    # The weights as scalars: LLVM keeps them in registers across the loop.
    w0, w1, w2, w3, w4, w5, w6, w7, w8 = (
        wm[0, 0],
        wm[0, 1],
        wm[0, 2],
        wm[1, 0],
        wm[1, 1],
        wm[1, 2],
        wm[2, 0],
        wm[2, 1],
        wm[2, 2],
    )
    dst = o[lo:hi]
    mid = x[lo - 1 : hi + 1]
    a = x[max(0, lo - width - 1) : max(0, hi - width + 1)]
    d = x[lo + width - 1 : hi + width + 1]
    if up and down:
        for i in range(hi - lo):
            dst[i] = b + _three(w0, w1, w2, a, i) + _three(w3, w4, w5, mid, i) + _three(w6, w7, w8, d, i)
    elif down:
        for i in range(hi - lo):
            dst[i] = b + _three(w3, w4, w5, mid, i) + _three(w6, w7, w8, d, i)
    else:
        for i in range(hi - lo):
            dst[i] = b + _three(w0, w1, w2, a, i) + _three(w3, w4, w5, mid, i)


@njit(nogil=True, cache=True)
def _same3_plane(x, wm, b, o, height, width, code, alpha, beta):
    """One output plane of a 3x3 depthwise conv with unit strides and one pad cell on every
    side, in place on the flattened input and output planes (both at least 2x2): no padded
    copy in and no copy out.

    The first row, the rows between and the last row each run as one loop over the flattened
    plane (:func:`_same3_rows`). On the first and last column a tap of that loop wraps to the
    neighbouring row: those two columns are then written again, pixel by pixel."""
    total = height * width
    _same3_rows(o, x, 1, width - 1, False, True, b, wm, width)
    _same3_rows(o, x, width + 1, total - width - 1, True, True, b, wm, width)
    _same3_rows(o, x, total - width + 1, total - 1, True, False, b, wm, width)
    last = width - 1
    for r in range(height):
        i = r * width
        first_sum = b
        last_sum = b
        if r > 0:
            first_sum += wm[0, 1] * x[i - width] + wm[0, 2] * x[i - width + 1]
            last_sum += wm[0, 0] * x[i - 2] + wm[0, 1] * x[i - 1]
        first_sum += wm[1, 1] * x[i] + wm[1, 2] * x[i + 1]
        last_sum += wm[1, 0] * x[i + last - 1] + wm[1, 1] * x[i + last]
        if r < height - 1:
            first_sum += wm[2, 1] * x[i + width] + wm[2, 2] * x[i + width + 1]
            last_sum += wm[2, 0] * x[i + width + last - 1] + wm[2, 1] * x[i + width + last]
        o[i] = first_sum
        o[i + last] = last_sum
    activate_row(o, o, NO_BIAS, code, alpha, beta)


@njit(parallel=True, nogil=True, cache=True)
def depthwise_same3(x, w, bias, out, code, alpha, beta, bounds):
    """:func:`depthwise` for a 3x3 kernel, unit strides and dilations and one pad cell on each
    side (the output planes have the input's shape), on C-contiguous ``x`` and ``out`` with
    planes of at least 2x2: each plane by :func:`_same3_plane`."""
    channels, height, width = x.shape[1], x.shape[2], x.shape[3]
    m_count = out.shape[1]
    multiplier = m_count // channels
    pixels = height * width
    for s in prange(bounds.shape[0] - 1):
        for task in range(bounds[s], bounds[s + 1]):
            n, m = divmod(task, m_count)
            _same3_plane(
                x[n, m // multiplier].reshape(pixels),
                w[m],
                bias[m],
                out[n, m].reshape(pixels),
                height,
                width,
                code,
                alpha,
                beta,
            )
