"""Stride-1 Conv for CpuAcc with few output channels, one GEMM per kernel tap.

The input is copied once into a zero-padded plane per channel, and each kernel tap is one GEMM
of that tap's weights by the padded planes read from the tap's offset, accumulated into the
output block (outputs are computed on the padded plane's row pitch, the extra columns
dropped). im2col writes and reads back kh*kw copies of the input for every output block, which
costs more than the GEMM itself when there are only a few dozen output channels to share it.
:class:`~flowrt.workers.cpu.acc.kernels.conv.ConvKernel` calls it for such convs.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from flowrt.workers.cpu.acc.blas import PRANGE_ONLY, sgemm
from flowrt.workers.cpu.acc.kernels.epilogue import NO_BIAS, activate_row


@njit(parallel=PRANGE_ONLY, nogil=True, cache=True)
def conv_by_taps(x, w_taps, bias, out, geo, padded_shape, row_bounds, block_rows, finish, code, alpha, beta):
    """Stride 1, one group: every image is copied into zero-padded planes, then each slice of
    output rows is computed ``block_rows`` rows at a time, one GEMM per kernel tap
    (``w_taps``: (kh*kw, M, C)) reading the planes at the tap's offset; bias and activation
    are applied as each block's rows are copied out."""
    kh, kw, dh, dw, ph, pw = geo[0], geo[1], geo[4], geo[5], geo[6], geo[7]
    channels, height, width = x.shape[1], x.shape[2], x.shape[3]
    m_count, ow_count = out.shape[1], out.shape[3]
    pitch = padded_shape[1]
    padded = np.zeros((channels, padded_shape[0], pitch), np.float32)
    flat = padded.reshape(channels, -1)
    slices = row_bounds.shape[0] - 1
    for n in range(x.shape[0]):
        for c in prange(channels):
            padded[c, ph : ph + height, pw : pw + width] = x[n, c]
        for s in prange(slices):
            start, stop = row_bounds[s], row_bounds[s + 1]
            block = np.empty((m_count, block_rows * pitch), np.float32)
            for r0 in range(start, stop, block_rows):
                r1 = min(r0 + block_rows, stop)
                q0, q1 = r0 * pitch, (r1 - 1) * pitch + ow_count
                acc = block[:, : q1 - q0]
                for t in range(kh * kw):
                    offset = (t // kw) * dh * pitch + (t % kw) * dw
                    sgemm(
                        False,
                        False,
                        1.0,
                        w_taps[t],
                        flat[:, q0 + offset : q1 + offset],
                        1.0 if t else 0.0,
                        acc,
                    )
                for m in range(m_count):
                    b = bias[m] if finish else NO_BIAS
                    for r in range(r0, r1):
                        src = block[m, (r - r0) * pitch : (r - r0) * pitch + ow_count]
                        activate_row(out[n, m, r], src, b, code, alpha, beta)
