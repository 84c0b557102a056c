"""BitwiseAnd, BitwiseOr, BitwiseXor and BitwiseNot kernels (numpy keeps the integer type)."""

from __future__ import annotations

import numpy as np

from flowrt.workers.cpu.ref.kernels import ref_kernel

_BITWISE = {"BitwiseAnd": np.bitwise_and, "BitwiseOr": np.bitwise_or, "BitwiseXor": np.bitwise_xor}

for _name, _fn in _BITWISE.items():
    ref_kernel(_name)(lambda desc, a, b, fn=_fn: fn(a, b))


@ref_kernel("BitwiseNot")
def bitwise_not(desc, x):
    return np.invert(x)
