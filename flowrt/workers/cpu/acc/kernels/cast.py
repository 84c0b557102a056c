"""Cast and CastLike between bool, uint8, int8, int32, int64, float32 and float64, and between
float16 and float32.

Conversions are numpy's (``astype``): floats to integers truncate toward zero, to bool test
``!= 0`` (NaN is true), integers wrap. numba has no float16, so the float16 pairs take numpy's
own conversion loop (one call, no Python per element, one thread); every other pair is one
numba loop, split across the workers when large. A float out of an integer type's range gives
what the hardware gives, as in numpy: ONNX leaves it undefined.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from flowrt.engine.graph.layers.elementwise import onnx_dtype_to_datatype
from flowrt.errors import BackendError, DataTypeError
from flowrt.registry import Support, WorkloadInfo
from flowrt.types import DataType
from flowrt.workers.cpu.acc.calls import NATIVE, SliceFunction
from flowrt.workers.cpu.acc.kernels import acc_kernel
from flowrt.workers.cpu.acc.kernels.strided import FlatSplits

D = DataType
# The types the numba loop converts between, any pair.
NUMBA_TYPES = frozenset({D.BOOL, D.UINT8, D.INT8, D.INT32, D.INT64, D.FLOAT32, D.FLOAT64})
HALF_PAIRS = frozenset({(D.FLOAT16, D.FLOAT32), (D.FLOAT32, D.FLOAT16)})


@njit(nogil=True, cache=True)
def _convert(x, out, first, last):
    """``out[first:last]`` = ``x[first:last]`` in ``out``'s type (numba's conversions,
    numpy's rules)."""
    # Indices from 0 over slices: numba then drops its negative-index check, and the loop
    # vectorizes (a hundred times faster for bool to float32).
    s, d = x[first:last], out[first:last]
    for j in range(d.shape[0]):
        d[j] = s[j]


@njit(**NATIVE)
def _cast_slice(s, _step, bounds, x, out):
    """Slice ``s`` of :data:`_CAST` (a ``SliceFunction``)."""
    _convert(x, out, bounds[s], bounds[s + 1])


_CAST = SliceFunction(_cast_slice)


def _cast(x, out, bounds):
    """Every slice of ``bounds``, spread over the workers."""
    _CAST.run(bounds.shape[0] - 1, (bounds, x, out))


def target_type(info: WorkloadInfo) -> DataType | None:
    """The data type the layer casts to (None when CastLike's target input is absent)."""
    if info.kind == "CastLike":
        target = info.inputs[1] if len(info.inputs) > 1 else None
        return None if target is None else target.dtype
    try:
        return onnx_dtype_to_datatype(info.descriptor.to)
    except DataTypeError:
        return None


@acc_kernel("Cast", "CastLike")
class CastKernel:
    """One conversion over every element, split into slices across the CPU workers."""

    @classmethod
    def supports(cls, info: WorkloadInfo) -> Support:
        source, target = info.inputs[0], target_type(info)
        pair = (None if source is None else source.dtype, target)
        if not (set(pair) <= NUMBA_TYPES or pair in HALF_PAIRS):
            names = " to ".join("none" if d is None else d.name.lower() for d in pair)
            return Support.no(
                f"CpuAcc {info.kind} converts between bool, uint8, int8, int32, int64, float32 and float64, "
                f"and float16 with float32, only; got {names}"
            )
        return Support.yes()

    def __init__(self, info: WorkloadInfo, workers: int) -> None:
        if info.activation is not None:
            raise BackendError(f"CpuAcc {info.kind} {info.layer_name!r} cannot apply a fused activation")
        self.info = info
        self.workers = workers
        source, target = info.inputs[0], target_type(info)
        assert source is not None and target is not None  # supports took the layer
        self.dtype = target.numpy
        self.half = source.dtype is D.FLOAT16 or self.dtype == np.float16
        self.bounds = FlatSplits(workers)  # slice boundaries over a size, once per size

    def execute(self, inputs, outputs=None):
        x = np.asarray(inputs[0], order="C")
        out = np.empty(x.shape, self.dtype) if outputs is None else outputs[0]
        if self.half:
            with np.errstate(all="ignore"):  # float32 beyond float16's range is inf, as in CpuRef
                np.copyto(out, x, casting="unsafe")
            return [out]
        bounds = self.bounds(x.size)
        if bounds.shape[0] > 2:
            _cast(x.reshape(-1), out.reshape(-1), bounds)
        else:
            _convert(x.reshape(-1), out.reshape(-1), 0, x.size)
        return [out]
