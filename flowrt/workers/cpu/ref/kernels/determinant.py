"""Det kernel."""

from __future__ import annotations

import numpy as np

from flowrt.errors import ShapeError
from flowrt.workers.cpu.ref.kernels import ref_kernel


@ref_kernel("Det")
def det(desc, x):
    if x.ndim < 2 or x.shape[-1] != x.shape[-2]:
        raise ShapeError(f"Det: square matrices [*, M, M] expected, got {x.shape}")
    # numpy's LAPACK path has no float16: compute it in float32.
    compute = np.float32 if x.dtype == np.float16 else x.dtype
    return np.asarray(np.linalg.det(x.astype(compute, copy=False))).astype(x.dtype)
