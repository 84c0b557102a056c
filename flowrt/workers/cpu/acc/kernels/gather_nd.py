"""GatherND: each tuple of the last dim of the indices addresses that many leading dims of the
data (after ``batch_dims`` dims the two share), and picks the slice below them; int32 or
int64 indices (negative ones count from the end), any data type of 1, 2, 4 or 8 bytes.

Seen as rows: the data is ``batch`` blocks of ``prod(data.shape[b:b+k])`` rows of ``inner``
elements (``inner`` the product of the dims below the addressed ones), the indices ``batch``
blocks of ``tuples`` tuples, and output row ``t * tuples + j`` is the row tuple ``j`` of block
``t`` addresses. An index outside its dim is refused with the position it was found at.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

from flowrt.errors import BackendError, ShapeError
from flowrt.registry import Support, WorkloadInfo
from flowrt.workers.cpu.acc.kernels import acc_kernel
from flowrt.workers.cpu.acc.kernels.strided import as_words, movable_data


@njit(nogil=True, cache=True)
def _gather_nd(x, indices, out, dims, tuples, inner):
    """``out`` row by row from ``x`` (flat words) at the tuples of ``indices`` ((batch *
    tuples, k), any integer type) into ``dims`` (the k addressed dims); the flat position
    in ``indices`` of the first index outside its dim, or -1 when all fit."""
    k = dims.shape[0]
    rows_per_block = 1
    for d in range(k):
        rows_per_block *= dims[d]
    for r in range(indices.shape[0]):
        row = 0
        for d in range(k):
            i = np.int64(indices[r, d])
            if i < 0:
                i += dims[d]
            if i < 0 or i >= dims[d]:
                return r * k + d
            row = row * dims[d] + i
        src = ((r // tuples) * rows_per_block + row) * inner
        dst = r * inner
        for j in range(inner):
            out[dst + j] = x[src + j]
    return -1


@acc_kernel("GatherND")
class GatherNDKernel:
    """GatherND as rows copied from the data (one thread: its rows are few in the models that
    use it, a rotary table's or a detector's picks)."""

    @classmethod
    def supports(cls, info: WorkloadInfo) -> Support:
        return movable_data(info)

    def __init__(self, info: WorkloadInfo, workers: int) -> None:
        if info.activation is not None:
            raise BackendError(f"CpuAcc GatherND {info.layer_name!r} cannot apply a fused activation")
        self.info = info
        self.batch_dims = info.descriptor.batch_dims

    def execute(self, inputs, outputs=None):
        x = np.asarray(inputs[0], order="C")
        indices = np.asarray(inputs[1], order="C")
        b, k = self.batch_dims, indices.shape[-1]
        shape = indices.shape[:-1] + x.shape[b + k :]
        out = np.empty(shape, x.dtype) if outputs is None else outputs[0]
        if out.size == 0:
            return [out]
        batch = math.prod(x.shape[:b])
        tuples = math.prod(indices.shape[b:-1])
        dims = np.array(x.shape[b : b + k], np.int64)
        bad = _gather_nd(
            as_words(x).reshape(-1),
            indices.reshape(batch * tuples, k),
            as_words(out).reshape(-1),
            dims,
            tuples,
            math.prod(x.shape[b + k :]),
        )
        if bad >= 0:
            at = np.unravel_index(bad, indices.shape)
            dim = int(dims[bad % k])
            raise ShapeError(
                f"GatherND {self.info.layer_name!r}: indices in [{-dim}, {dim}) expected, got "
                f"{int(indices[at])} at {tuple(int(i) for i in at)}"
            )
        return [out]
