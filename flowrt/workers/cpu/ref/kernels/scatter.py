"""ScatterElements, Scatter and ScatterND kernels.

The updates land through numpy fancy indexing: plain assignment for ``none`` (with repeated
indices the last update wins, which ONNX leaves undefined), and the unbuffered ``ufunc.at`` for
the reductions so that repeated indices combine every update.
"""

from __future__ import annotations

import numpy as np

from flowrt.workers.cpu.ref.kernels import ref_kernel

_REDUCE_UFUNCS = {"add": np.add, "mul": np.multiply, "max": np.maximum, "min": np.minimum}


def _scatter(
    data: np.ndarray, index: tuple[np.ndarray, ...], updates: np.ndarray, reduction: str
) -> np.ndarray:
    """A copy of ``data`` with ``updates`` put at ``index`` (a fancy index) by ``reduction``."""
    out = data.copy()
    if reduction == "none":
        out[index] = updates
    else:
        _REDUCE_UFUNCS[reduction].at(out, index, updates)
    return out


@ref_kernel("ScatterElements", "Scatter")
def scatter_elements(desc, data, indices, updates):
    axis = desc.axis % data.ndim
    # Each update's position: its own index on every axis but ``axis``, where indices says.
    index = list(np.indices(indices.shape, sparse=True))
    index[axis] = indices.astype(np.int64, copy=False)
    return _scatter(data, tuple(index), updates, getattr(desc, "reduction", "none"))


@ref_kernel("ScatterND")
def scatter_nd(desc, data, indices, updates):
    k = indices.shape[-1]
    count = int(np.prod(indices.shape[:-1], dtype=np.int64))
    tuples = indices.reshape(count, k).astype(np.int64, copy=False)
    flat_updates = updates.reshape((count,) + data.shape[k:])
    return _scatter(data, tuple(tuples.T), flat_updates, desc.reduction)
