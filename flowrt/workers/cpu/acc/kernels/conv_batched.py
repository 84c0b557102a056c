"""Conv over a batch of small images as one GEMM: the images' column matrices side by side.

A layer with few output pixels (the 7x7 to 14x14 stages of the ImageNet models) makes a
GEMM only tens of columns wide, where BLAS runs below its speed, and a batch of such images
would read the layer's weights (up to megabytes, from L3 or memory) once per image. Here every image's
column matrix (its im2col, or its input itself for a 1x1 stride-1 conv) is copied into one
matrix ``(C/group * kh * kw, N * pixels)``, one GEMM per (group, column slice) multiplies the
weights by it, and the product is copied back into each image's output with bias and the
activation. The copies are small against the GEMM they widen.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from flowrt.workers.cpu.acc.blas import PRANGE_ONLY, sgemm
from flowrt.workers.cpu.acc.kernels.epilogue import activate_row
from flowrt.workers.cpu.acc.kernels.im2col import fill_columns
from flowrt.workers.cpu.acc.kernels.phases import copy_run

# A batch runs as one GEMM when each image has at most MERGE_PIXELS output pixels and the
# layer's weights (per group) are at least MERGE_WEIGHTS floats: with fewer, they stay in L2
# from one image to the next, and the copies cost more than the wider GEMM saves (measured on
# the 14x14 and 13x13 layers of inception_v2 and squeezenet, where 1x1 convs of 32K-55K weights
# ran 10-20% slower merged, those of 256K-2M weights 5-10% faster).
MERGE_PIXELS = 256
MERGE_WEIGHTS = 1 << 18


@njit(parallel=PRANGE_ONLY, nogil=True, cache=True)
def conv_batched(x, x_flat, w, bias, out, geo, direct, bounds, code, alpha, beta):
    """``out`` (N, M, pixels) for every image of ``x``, by one GEMM per (group, slice of
    ``bounds`` over the N * pixels columns)."""
    groups, mg, kg = w.shape
    cg = x.shape[1] // groups
    batch, pixels = out.shape[0], out.shape[2]
    columns = np.empty((groups * kg, batch, pixels), np.float32)
    product = np.empty((groups * mg, batch * pixels), np.float32)
    for task in prange(batch * groups * kg):
        n, r = divmod(np.int64(task), groups * kg)
        if direct:
            copy_run(columns[r, n], x_flat[n, r])
        else:
            g, rg = divmod(r, kg)
            fill_columns(x[n], x_flat[n], g * cg, geo, rg, np.int64(0), columns[r, n : n + 1])
    matrix = columns.reshape((groups * kg, batch * pixels))
    slices = bounds.shape[0] - 1
    for task in prange(groups * slices):
        g, s = divmod(np.int64(task), slices)
        q0, q1 = bounds[s], bounds[s + 1]
        sgemm(
            False,
            False,
            1.0,
            w[g],
            matrix[g * kg : (g + 1) * kg, q0:q1],
            0.0,
            product[g * mg : (g + 1) * mg, q0:q1],
        )
    for task in prange(batch * groups * mg):
        n, m = divmod(np.int64(task), groups * mg)
        activate_row(out[n, m], product[m][n * pixels : (n + 1) * pixels], bias[m], code, alpha, beta)
