"""QuantizeLinear and DequantizeLinear per tensor between float32 and uint8 or int8: the
quantized activations of a QDQ model (its constant weights' DequantizeLinear folds at load).

QuantizeLinear: q = saturate(round_half_even(x / scale) + zero_point), the division in
float32 as CpuRef and ONNX Runtime do it; DequantizeLinear: y = (q - zero_point) * scale in
float32. One loop over the elements, split into slices across the CPU workers when large.
Per-axis and per-block parameters, other types and a ``precision`` other than float32 run
on CpuRef.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from flowrt.engine.graph.layers.quantize import dequantized_type, precision_type, quantized_type
from flowrt.errors import BackendError, DataTypeError
from flowrt.registry import Support, WorkloadInfo
from flowrt.types import DataType
from flowrt.workers.cpu.acc.calls import NATIVE, SliceFunction
from flowrt.workers.cpu.acc.kernels import acc_kernel
from flowrt.workers.cpu.acc.kernels.strided import FlatSplits

D = DataType
INT8_TYPES = frozenset({D.UINT8, D.INT8})


@njit(**NATIVE)
def _quantize_slice(s, _step, bounds, x, out, scale, zero, low, high):
    """Slice ``s`` of :data:`QUANTIZE`: ``out = clip(rint(x / scale) + zero, low, high)``."""
    first, last = bounds[s], bounds[s + 1]
    source, target = x[first:last], out[first:last]
    for j in range(target.shape[0]):
        v = np.rint(source[j] / scale) + zero
        target[j] = min(max(v, low), high)


@njit(**NATIVE)
def _dequantize_slice(s, _step, bounds, x, out, scale, zero):
    """Slice ``s`` of :data:`DEQUANTIZE`: ``out = (x - zero) * scale``."""
    first, last = bounds[s], bounds[s + 1]
    source, target = x[first:last], out[first:last]
    for j in range(target.shape[0]):
        target[j] = (np.float32(source[j]) - zero) * scale


QUANTIZE = SliceFunction(_quantize_slice)
DEQUANTIZE = SliceFunction(_dequantize_slice)


def _per_tensor(info: WorkloadInfo) -> str | None:
    """Why CpuAcc declines the layer's scale and zero point, or None when it takes them."""
    scale = info.inputs[1] if len(info.inputs) > 1 else None
    zero = info.inputs[2] if len(info.inputs) > 2 else None
    if scale is None or scale.dtype is not D.FLOAT32 or scale.num_elements != 1:
        return "a float32 scale of one element"
    if zero is not None and (zero.dtype not in INT8_TYPES or zero.num_elements != 1):
        return "a uint8 or int8 zero point of one element"
    if info.descriptor.block_size:
        return "no blocks"
    return None


def _quantize_support(info: WorkloadInfo) -> str | None:
    x = info.inputs[0]
    if x is None or x.dtype is not D.FLOAT32:
        return "float32 data"
    zero = info.inputs[2] if len(info.inputs) > 2 else None
    try:
        target = quantized_type(info.descriptor, None if zero is None else zero.dtype)
    except DataTypeError:
        return "a uint8 or int8 output"
    if target not in INT8_TYPES:
        return "a uint8 or int8 output"
    if precision_type(info.descriptor) not in (None, D.FLOAT32):
        return "float32 precision"
    return _per_tensor(info)


def _dequantize_support(info: WorkloadInfo) -> str | None:
    x = info.inputs[0]
    if x is None or x.dtype not in INT8_TYPES:
        return "uint8 or int8 data"
    try:
        target = dequantized_type(info.descriptor, D.FLOAT32)
    except DataTypeError:
        return "a float32 output"
    if target is not D.FLOAT32:
        return "a float32 output"
    return _per_tensor(info)


@acc_kernel("QuantizeLinear", "DequantizeLinear")
class QuantizeKernel:
    """QuantizeLinear or DequantizeLinear per tensor (see the module doc)."""

    @classmethod
    def supports(cls, info: WorkloadInfo) -> Support:
        why = (_quantize_support if info.kind == "QuantizeLinear" else _dequantize_support)(info)
        if why is not None:
            return Support.no(f"CpuAcc {info.kind} takes {why} only (per tensor, float32 with uint8 or int8)")
        return Support.yes()

    def __init__(self, info: WorkloadInfo, workers: int) -> None:
        if info.activation is not None:
            raise BackendError(f"CpuAcc {info.kind} {info.layer_name!r} cannot apply a fused activation")
        self.info, self.workers = info, workers
        self.quantize = info.kind == "QuantizeLinear"
        out = info.outputs[0]
        assert out is not None  # shape inference typed the output
        self.dtype = out.dtype.numpy
        if self.quantize:  # the saturation bounds, as float32 values the loop compares with
            limits = np.iinfo(self.dtype)
            self.low, self.high = np.float32(limits.min), np.float32(limits.max)
        self.bounds = FlatSplits(workers)  # slice boundaries over a size, once per size

    def execute(self, inputs, outputs=None):
        x = np.asarray(inputs[0], order="C")
        scale = np.float32(np.asarray(inputs[1]).reshape(()))
        zero_point = inputs[2] if len(inputs) > 2 else None
        zero = np.float32(0 if zero_point is None else np.asarray(zero_point).reshape(()))
        out = np.empty(x.shape, self.dtype) if outputs is None else outputs[0]
        bounds = self.bounds(x.size)
        flat, flat_out = x.reshape(-1), out.reshape(-1)
        if self.quantize:
            args = (bounds, flat, flat_out, scale, zero, self.low, self.high)
            QUANTIZE.run(bounds.shape[0] - 1, args)
        else:
            DEQUANTIZE.run(bounds.shape[0] - 1, (bounds, flat, flat_out, scale, zero))
        return [out]
