"""The conv algorithms' epilogue, compiled once: bias and activation over a row of outputs.

``epilogue.activate_row`` is inlined where it is called: three loops and a call through a
slot, 0.3 s of a cold cache in every kernel that calls it. The algorithms reach
:func:`finish_row`, which holds the one copy, through a slot (``calls.LateFunction``): it is
compiled once, at its first call, and linked into none of them. A call per row of outputs
costs nothing beside the row's work.
"""

from __future__ import annotations

import numpy as np
from numba import njit, types

from flowrt.workers.cpu.acc.calls import NATIVE, LateFunction, call_late
from flowrt.workers.cpu.acc.kernels.epilogue import activate_row


@njit(**NATIVE)
def finish_row(row, bias, code, alpha, beta):
    """``row = activate(row + bias)`` in place, over a C-contiguous float32 row (``bias``
    float32, ``code`` int64, ``alpha`` and ``beta`` float32)."""
    activate_row(row, row, bias, code, alpha, beta)


FINISH_ROW_NAME = "flowrt_finish_row"
FINISH_ROW = LateFunction(
    finish_row,
    (types.Array(types.float32, 1, "C"), types.float32, types.int64, types.float32, types.float32),
    FINISH_ROW_NAME,
)


@njit(inline="always", nogil=True, cache=True)
def finish_row_late(row, bias, code, alpha, beta):
    """:func:`finish_row` through its slot (``FINISH_ROW``)."""
    call_late(FINISH_ROW_NAME, (row, np.float32(bias), np.int64(code), np.float32(alpha), np.float32(beta)))
