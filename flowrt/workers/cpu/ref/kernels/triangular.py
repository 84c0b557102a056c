"""Trilu and EyeLike kernels."""

from __future__ import annotations

import numpy as np

from flowrt.engine.graph.layers.triangular import eye_like_dtype
from flowrt.types import DataType
from flowrt.workers.cpu.ref.kernels import ref_kernel


@ref_kernel("Trilu")
def trilu(desc, x, k=None):
    offset = 0 if k is None else int(np.asarray(k).reshape(-1)[0])
    # np.triu/np.tril work on the last two axes of any rank, as Trilu does.
    return np.triu(x, offset) if desc.upper else np.tril(x, offset)


@ref_kernel("EyeLike")
def eye_like(desc, x):
    dtype = eye_like_dtype(desc, DataType.from_numpy(x.dtype))
    rows, cols = x.shape
    return np.eye(rows, cols, k=desc.k, dtype=dtype.numpy)
