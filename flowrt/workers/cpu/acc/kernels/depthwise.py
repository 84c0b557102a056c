"""Depthwise Conv for CpuAcc (one input channel per group, NCHW): a direct sliding window over
a zero-padded copy of each input channel (split into phase planes when strided), one task per
(image, output channel) plane.
:class:`~flowrt.workers.cpu.acc.kernels.conv.ConvKernel` calls it for such convs."""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from flowrt.workers.cpu.acc.kernels.epilogue import NO_BIAS, activate_row


@njit(inline="always", nogil=True, cache=True)
def _phase_floats(geo, oh_count, ow_count):
    """Scratch for a strided plane's phase planes (none for unit strides)."""
    kh, kw, sh, sw, dh, dw = geo[0], geo[1], geo[2], geo[3], geo[4], geo[5]
    if sh == 1 and sw == 1:
        return 0
    return sh * sw * (oh_count + (kh - 1) * dh // sh) * (ow_count + (kw - 1) * dw // sw)


@njit(nogil=True, cache=True)
def _depthwise_plane(plane, wm, b, out_plane, acc, phases, geo, code, alpha, beta):
    """One output plane of a depthwise conv from its zero-padded input plane.

    Every tap is one long unit-stride loop over the flattened plane (or, strided, one of its
    phase planes): the output is computed on that plane's row pitch (a few columns per row too
    many, then dropped), which LLVM vectorizes. ``acc`` and ``phases`` are scratch of at least
    one padded plane (and :func:`_phase_floats`)."""
    kh, kw, sh, sw, dh, dw = geo[0], geo[1], geo[2], geo[3], geo[4], geo[5]
    oh_count, ow_count = out_plane.shape
    if sh == 1 and sw == 1:
        flat = plane.reshape(-1)
        rows, pitch = plane.shape
    else:
        # The padded plane is first split into its ``sh * sw`` phase planes (the pixels whose
        # row and column are i and j modulo the strides), ``pitch`` wide, so that each tap
        # reads one phase plane from a fixed offset, as unit strides read the plane itself.
        rows = oh_count + (kh - 1) * dh // sh
        pitch = ow_count + (kw - 1) * dw // sw
        for i in range(sh):
            for j in range(sw):
                phase = phases[(i * sw + j) * rows * pitch : (i * sw + j + 1) * rows * pitch]
                for r in range(rows):
                    dst = phase[r * pitch : (r + 1) * pitch]
                    if i + r * sh >= plane.shape[0]:
                        dst[:] = 0
                        continue
                    src = plane[i + r * sh]
                    for c in range(pitch):
                        col = j + c * sw
                        dst[c] = src[col] if col < src.shape[0] else 0
        flat = phases
    total = (oh_count - 1) * pitch + ow_count
    run = acc[:total]
    for i in range(total):
        run[i] = b
    for ki in range(kh):
        for kj in range(kw):
            wv = wm[ki, kj]
            p = ((ki * dh) % sh) * sw + (kj * dw) % sw
            start = p * rows * pitch + (ki * dh // sh) * pitch + kj * dw // sw
            src = flat[start : start + total]
            for i in range(total):
                run[i] += wv * src[i]
    for oh in range(oh_count):
        activate_row(out_plane[oh], run[oh * pitch : oh * pitch + ow_count], NO_BIAS, code, alpha, beta)


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
        phases = np.empty(_phase_floats(geo, oh_count, ow_count), np.float32)
        for task in range(bounds[s], bounds[s + 1]):
            n, m = divmod(task, m_count)
            plane[ph : ph + height, pw : pw + width] = x[n, m // multiplier]
            _depthwise_plane(plane, w[m], bias[m], out[n, m], acc, phases, geo, code, alpha, beta)
