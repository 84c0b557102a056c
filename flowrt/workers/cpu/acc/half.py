"""Weights stored in float16, computed in float32 (``OptimizerOptions(reduce_fp32_to_fp16=True)``
on CpuAcc, which declares capability ``fp16_weights``).

numba has no float16 type, so a half-precision array is held as its bits, ``uint16``
(:func:`to_half`), and a kernel reads each value through :func:`widen`, which is the identity
on float32 and, on those bits, LLVM's ``fpext half to float``: a loop over them vectorizes to
the CPU's conversion instructions (F16C's ``vcvtph2ps``, eight or sixteen values at once), so
the same numba function compiled for float32 or for half weights reads each weight once, in
half the bytes. The register tiles read half panels the same way (``tile_ir.py``).
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import types
from numba.extending import intrinsic

# The dtype of a half-precision array as the kernels hold it.
HALF_BITS = np.dtype(np.uint16)


def to_half(values: np.ndarray) -> np.ndarray:
    """``values`` rounded to float16 (to nearest even; beyond float16's range, infinity), as
    their bits: a read-only uint16 array of the same shape."""
    with np.errstate(over="ignore"):
        bits = np.ascontiguousarray(values, np.float32).astype(np.float16).view(HALF_BITS)
    bits.flags.writeable = False
    return bits


def from_half(bits: np.ndarray) -> np.ndarray:
    """The float32 values of :func:`to_half`'s bits."""
    return bits.view(np.float16).astype(np.float32)


def is_half(array: np.ndarray) -> bool:
    """Whether ``array`` holds float16 bits (:func:`to_half`) rather than float32 values."""
    return array.dtype == HALF_BITS


def half_to_float(builder: ir.IRBuilder, bits: ir.Value) -> ir.Value:
    """The IR of float16 ``bits`` (i16, or a vector of them) as float32 (or a vector)."""
    if isinstance(bits.type, ir.VectorType):
        count = bits.type.count
        halves = builder.bitcast(bits, ir.VectorType(ir.HalfType(), count))
        return builder.fpext(halves, ir.VectorType(ir.FloatType(), count))
    return builder.fpext(builder.bitcast(bits, ir.HalfType()), ir.FloatType())


@intrinsic
def widen(typingctx, value):
    """``value`` as float32: a float32 as it is, a uint16 read as float16's bits."""
    if value == types.float32:
        return types.float32(value), lambda context, builder, signature, args: args[0]
    if value == types.uint16:
        return types.float32(value), lambda context, builder, signature, args: half_to_float(builder, args[0])
    return None
