"""Cast and CastLike kernels, and the conversion to any data type that QuantizeLinear shares.

Conversions are numpy's ``astype`` (``ml_dtypes``' for the low-precision types), as in onnx's
reference: floats round to nearest even, floats to integers truncate toward zero, integers
wrap. ONNX adds two rules, both from its Cast tables:

* a float8 target (e4m3fn, e4m3fnuz, e5m2, e5m2fnuz) with ``saturate`` clamps values beyond
  its largest finite value, infinities included, to that value; without, they become NaN
  (or infinity where the type has one).
* float8e8m0 (a power of two, 2**-127 to 2**127, no sign) rounds by ``round_mode``: up
  (to the next power of two), down, or nearest (ties up); with ``saturate`` a value beyond
  its range becomes its largest or smallest value, infinity included; without, NaN.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np

from flowrt.engine.graph.layers.elementwise import cast_target, onnx_dtype_to_datatype
from flowrt.types import DataType
from flowrt.workers.cpu.ref.kernels import ref_kernel

D = DataType
SATURATING_TYPES = frozenset({D.FLOAT8E4M3FN, D.FLOAT8E4M3FNUZ, D.FLOAT8E5M2, D.FLOAT8E5M2FNUZ})
_E8M0_BIAS = 127
_E8M0_MAX = 254  # 255 is NaN
_E8M0_NAN = 255


def widened(x: np.ndarray) -> np.ndarray:
    """``x`` as float32 when its type is a low-precision one, else as is. float32 holds every
    value of those types exactly, and converts to each of them: ml_dtypes registers no casts
    between two of its own types."""
    return x.astype(np.float32) if D.from_numpy(x.dtype).is_low_precision else x


def to_float8e8m0(x: np.ndarray, saturate: bool, round_mode: str) -> np.ndarray:
    """``x`` (any real type) as float8e8m0, by the rules in the module docstring. The sign is
    dropped (ONNX leaves negative values unspecified; onnx's reference drops it too)."""
    magnitude = np.abs(np.asarray(x, dtype=np.float64))
    with np.errstate(all="ignore"):
        mantissa, exponent = np.frexp(magnitude)  # magnitude = mantissa * 2**exponent, mantissa in [0.5, 1)
    power = exponent.astype(np.int64) - 1  # magnitude = (2 * mantissa) * 2**power
    if round_mode == "up":
        power += mantissa > 0.5
    elif round_mode == "nearest":
        power += mantissa >= 0.75
    elif round_mode != "down":
        raise ValueError(f"round_mode 'up', 'down' or 'nearest' expected, got {round_mode!r}")
    biased = power + _E8M0_BIAS
    too_big = (biased > _E8M0_MAX) | np.isinf(magnitude)
    too_small = (biased < 0) | (magnitude == 0)
    biased = np.where(too_big, _E8M0_MAX if saturate else _E8M0_NAN, biased)
    biased = np.where(too_small, 0 if saturate else _E8M0_NAN, biased)
    biased = np.where(np.isnan(magnitude), _E8M0_NAN, biased)
    return biased.astype(np.uint8).view(ml_dtypes.float8_e8m0fnu)


def convert(x: np.ndarray, target: DataType, *, saturate: bool = True, round_mode: str = "up") -> np.ndarray:
    """``x`` converted to ``target`` as ONNX's Cast does (see the module docstring)."""
    if D.from_numpy(x.dtype) is target:
        return x.copy()
    x = widened(x)
    if target is D.FLOAT8E8M0:
        return to_float8e8m0(x, saturate, round_mode)
    with np.errstate(all="ignore"):
        if target in SATURATING_TYPES and saturate:
            info = ml_dtypes.finfo(target.numpy)
            # A float input keeps its type (float16 holds every float8 bound); others go through float64.
            x = np.clip(x if x.dtype.kind == "f" else x.astype(np.float64), float(info.min), float(info.max))
        return x.astype(target.numpy)


@ref_kernel("Cast")
def cast(desc, x):
    target = cast_target(onnx_dtype_to_datatype(desc.to))
    return convert(x, target, saturate=bool(desc.saturate), round_mode=desc.round_mode)


@ref_kernel("CastLike")
def cast_like(desc, x, target):
    dtype = cast_target(D.from_numpy(target.dtype))
    return convert(x, dtype, saturate=bool(desc.saturate), round_mode=desc.round_mode)
