"""Sums over a contiguous row that vectorize: the statistics of LayerNormalization, RMSNorm
and Softmax.

LLVM vectorizes a floating-point sum only where it may reassociate it (``fastmath``'s
``reassoc``): then it keeps one running sum per vector lane and adds them at the end. Without
it each add waits for the one before (four cycles), a nanosecond per element. These
functions carry only that flag (no ``nnan``: NaN and the infinities still propagate), sum in
float64 as the kernels' accuracy asks, and take rows typed contiguous. They are plain
functions, not ``inline="always"``: numba inlines those into its own IR, which then takes
the caller's flags, and the sum no longer vectorizes.
"""

from __future__ import annotations

import numpy as np
from numba import njit

_REASSOCIATE = {"reassoc"}


@njit(nogil=True, cache=True, fastmath=_REASSOCIATE)
def row_sum(x) -> float:
    """The sum of ``x``'s values, in float64."""
    total = 0.0
    for k in range(x.shape[0]):
        total += x[np.uint64(k)]
    return total


@njit(nogil=True, cache=True, fastmath=_REASSOCIATE)
def row_sum_of_squares(x, center) -> float:
    """The sum of ``(x - center) ** 2`` over ``x``, the difference in float32 and the square
    and the sum in float64."""
    total = 0.0
    for k in range(x.shape[0]):
        d = np.float64(x[np.uint64(k)] - center)
        total += d * d
    return total
