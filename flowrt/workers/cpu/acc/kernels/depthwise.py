"""Depthwise Conv for CpuAcc (one input channel per group, NCHW): a direct sliding window over
a zero-padded copy of each input channel, one task per (image, output channel) plane.
:class:`~flowrt.workers.cpu.acc.kernels.conv.ConvKernel` calls it for such convs."""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from flowrt.workers.cpu.acc.kernels.epilogue import NO_BIAS, activate_row


@njit(nogil=True, cache=True)
def _depthwise_plane(plane, wm, b, out_plane, acc, geo, code, alpha, beta):
    """One output plane of a depthwise conv from its zero-padded input plane.

    With unit strides every tap is one long unit-stride loop over the flattened plane: the
    output is computed on the padded plane's row pitch (a few columns per row too many, then
    dropped), which LLVM vectorizes. Other strides walk output rows. ``acc`` is scratch of at
    least one padded plane."""
    kh, kw, sh, sw, dh, dw = geo[0], geo[1], geo[2], geo[3], geo[4], geo[5]
    oh_count, ow_count = out_plane.shape
    pitch = plane.shape[1]
    if sh == 1 and sw == 1:
        flat = plane.reshape(-1)
        total = (oh_count - 1) * pitch + ow_count
        run = acc[:total]
        for i in range(total):
            run[i] = b
        for ki in range(kh):
            for kj in range(kw):
                wv = wm[ki, kj]
                start = ki * dh * pitch + kj * dw
                src = flat[start : start + total]
                for i in range(total):
                    run[i] += wv * src[i]
        for oh in range(oh_count):
            activate_row(out_plane[oh], run[oh * pitch : oh * pitch + ow_count], NO_BIAS, code, alpha, beta)
        return
    line = acc[:ow_count]
    for oh in range(oh_count):
        for ow in range(ow_count):
            line[ow] = b
        for ki in range(kh):
            src = plane[oh * sh + ki * dh]
            for kj in range(kw):
                wv = wm[ki, kj]
                for ow in range(ow_count):
                    line[ow] += wv * src[kj * dw + ow * sw]
        activate_row(out_plane[oh], line, NO_BIAS, code, alpha, beta)


@njit(parallel=True, nogil=True, cache=True)
def depthwise(x, w, bias, out, geo, code, alpha, beta, bounds):
    """Tasks are (image, output channel) planes, cut into slices by ``bounds``: a direct sliding
    window over a zero-padded copy of the input channel (output channel m reads input
    channel m // multiplier)."""
    kh, kw, sh, sw, dh, dw, ph, pw = geo[0], geo[1], geo[2], geo[3], geo[4], geo[5], geo[6], geo[7]
    channels, height, width = x.shape[1], x.shape[2], x.shape[3]
    m_count, oh_count, ow_count = out.shape[1], out.shape[2], out.shape[3]
    multiplier = m_count // channels
    padded_h = max(ph + height, (oh_count - 1) * sh + (kh - 1) * dh + 1)
    padded_w = max(pw + width, (ow_count - 1) * sw + (kw - 1) * dw + 1)
    for s in prange(bounds.shape[0] - 1):
        # scratch per slice: the padded plane (its border stays zero) and the accumulator
        plane = np.zeros((padded_h, padded_w), np.float32)
        acc = np.empty(padded_h * padded_w, np.float32)
        for task in range(bounds[s], bounds[s + 1]):
            n, m = divmod(task, m_count)
            plane[ph : ph + height, pw : pw + width] = x[n, m // multiplier]
            _depthwise_plane(plane, w[m], bias[m], out[n, m], acc, geo, code, alpha, beta)
