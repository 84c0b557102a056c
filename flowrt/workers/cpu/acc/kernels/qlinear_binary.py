"""QLinearAdd and QLinearMul (the QDQ fold's, see ``flowrt.engine.graph.layers.quantize``):
``C = quantize(dequantize(A) op dequantize(B))`` in one pass over the elements, where the
group it stands for made four (two DequantizeLinear, the float op, a QuantizeLinear) and
moved float32 values between them.

Each element is computed with the float32 operations, in the order, that CpuAcc's
DequantizeLinear, Add or Mul and QuantizeLinear use, so the results are those of the group
bit for bit: ``a = (float32(A) - A_zp) * A_scale``, ``b`` alike (a float32 B as it is),
``C = clip(rint((a op b) / C_scale) + C_zp)``. B broadcasts when its shape is the trailing
part of A's (a bias row, a scalar), or A's when B has the output's shape (the operands are
then taken the other way round: Add and Mul commute); other broadcasts run on CpuRef.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from flowrt.errors import BackendError
from flowrt.registry import Support, WorkloadInfo
from flowrt.types import DataType
from flowrt.workers.cpu.acc.calls import NATIVE, SliceFunction
from flowrt.workers.cpu.acc.kernels import acc_kernel
from flowrt.workers.cpu.acc.kernels.strided import FlatSplits
from flowrt.workers.cpu.acc.quantized_parameters import ParameterCache

D = DataType
# Shorter rows of B repeating along A cost more per row than they save in passes.
MIN_ROW = 32


@njit(nogil=True, cache=True, inline="always")
def _qlinear(s, bounds, a, b, params, out, multiply):
    """Elements ``bounds[s] .. bounds[s + 1]`` of the flat ``out`` from the flat ``a`` and
    ``b`` (``b`` repeating every ``b.size``), a row of ``b`` at a time: loops with affine
    indices, which vectorize. ``params``: A's zero point and scale, B's, C's scale and zero
    point, C's bounds (float32). ``multiply`` is a constant of each caller."""
    a_zero, a_scale, b_zero, b_scale = params[0], params[1], params[2], params[3]
    c_scale, c_zero, low, high = params[4], params[5], params[6], params[7]
    width = b.shape[0]
    i, last = bounds[s], bounds[s + 1]
    if width == 1:  # a scalar B
        y = (np.float32(b[0]) - b_zero) * b_scale
        rows_a, rows_out = a[i:last], out[i:last]
        for t in range(last - i):
            x = (np.float32(rows_a[t]) - a_zero) * a_scale
            v = np.rint((x * y if multiply else x + y) / c_scale) + c_zero
            rows_out[t] = min(max(v, low), high)
        return
    while i < last:
        column = i % width
        stop = min(last, i - column + width)  # the end of this row of b
        # range indices over slices, unit stride: the loop vectorizes
        rows_a, rows_b, rows_out = a[i:stop], b[column : column + stop - i], out[i:stop]
        for t in range(stop - i):
            x = (np.float32(rows_a[t]) - a_zero) * a_scale
            y = (np.float32(rows_b[t]) - b_zero) * b_scale
            v = np.rint((x * y if multiply else x + y) / c_scale) + c_zero
            rows_out[t] = min(max(v, low), high)
        i = stop


@njit(**NATIVE)
def _add_slice(s, _step, bounds, a, b, params, out):
    """Slice ``s`` of QLinearAdd (:func:`_qlinear`)."""
    _qlinear(s, bounds, a, b, params, out, False)


@njit(**NATIVE)
def _mul_slice(s, _step, bounds, a, b, params, out):
    """Slice ``s`` of QLinearMul (:func:`_qlinear`)."""
    _qlinear(s, bounds, a, b, params, out, True)


SLICES = {"QLinearAdd": SliceFunction(_add_slice), "QLinearMul": SliceFunction(_mul_slice)}


def _why_not(info: WorkloadInfo) -> str | None:
    """Why CpuAcc declines the layer, or None. Add and Mul commute: a layer whose B has the
    output's shape and A is the smaller (ONNX Runtime's QOperator format writes a bias first)
    is taken with its operands the other way round (:func:`swapped`), exactly: the float
    ``a op b`` equals ``b op a``."""
    why = _why_not_as(info, 0, 3)
    if why is None:
        return None
    other = _why_not_as(info, 3, 0)
    a, out = info.inputs[0], info.outputs[0]
    if a is not None and out is not None and a.shape != out.shape:  # B is the output's shape, if either
        return other
    return why


def swapped(info: WorkloadInfo) -> bool:
    """Whether CpuAcc takes the layer with A and B the other way round (see :func:`_why_not`)."""
    return _why_not_as(info, 0, 3) is not None and _why_not_as(info, 3, 0) is None


def _why_not_as(info: WorkloadInfo, first: int, second: int) -> str | None:
    """Why CpuAcc declines the layer with input ``first`` as A and ``second`` as B, or None."""
    a, b = info.inputs[first], info.inputs[second]
    out = info.outputs[0]
    if a is None or b is None or out is None or not (a.is_static and b.is_static and out.is_static):
        return "static shapes"
    inputs = list(info.inputs) + [None] * 8
    if any(inputs[i] is None for i in (2, 5, 7)):  # ONNX Runtime's schema lets them be left out
        return "zero points given"
    if a.dtype not in (D.UINT8, D.INT8) or out.dtype not in (D.UINT8, D.INT8):
        return "uint8 or int8 A and C"
    if b.dtype not in (D.UINT8, D.INT8, D.FLOAT32):
        return "a uint8, int8 or float32 B"
    a_shape, b_shape = tuple(a.shape or ()), tuple(b.shape or ())
    if tuple(out.shape or ()) != a_shape:
        return "a B that broadcasts to A's shape"
    trailing = b_shape
    while trailing and trailing[0] == 1:
        trailing = trailing[1:]
    if trailing and a_shape[len(a_shape) - len(trailing) :] != trailing:
        return "a B whose shape is the trailing part of A's"
    b_size, a_size = b.num_elements or 0, a.num_elements or 0  # static: checked above
    if 1 < b_size < MIN_ROW and b_size != a_size:
        return f"a B of one value, of A's shape, or of rows of {MIN_ROW} values or more"
    return None


@acc_kernel("QLinearAdd", "QLinearMul")
class QLinearBinaryKernel:
    """QLinearAdd or QLinearMul per tensor (see the module doc)."""

    @classmethod
    def supports(cls, info: WorkloadInfo) -> Support:
        why = _why_not(info)
        if why is not None:
            return Support.no(f"CpuAcc {info.kind} takes {why} only")
        return Support.yes()

    def __init__(self, info: WorkloadInfo, workers: int) -> None:
        if info.activation is not None:
            raise BackendError(f"CpuAcc {info.kind} {info.layer_name!r} cannot apply a fused activation")
        self.info, self.workers = info, workers
        self.slices = SLICES[info.kind]
        out = info.outputs[0]
        assert out is not None  # shape inference typed the output
        self.dtype = out.dtype.numpy
        limits = np.iinfo(self.dtype)
        self.low, self.high = np.float32(limits.min), np.float32(limits.max)
        self.bounds = FlatSplits(workers)  # slice boundaries over a size, once per size
        # The scales and zero points as the loop reads them, made once where they are constants.
        # Where A and B are taken the other way round (:func:`swapped`), their inputs and
        # parameters are read so.
        swap = swapped(info)
        self.operands = (3, 0) if swap else (0, 3)
        self.parameters = (4, 5, 1, 2, 6, 7) if swap else (1, 2, 4, 5, 6, 7)
        constants = tuple(info.constants) + (None,) * 8
        constant = all(constants[i] is not None for i in self.parameters)
        self.params = ParameterCache(self._params, constant)

    def _params(self, a_scale, a_zero, b_scale, b_zero, c_scale, c_zero) -> np.ndarray:
        scalars = [np.asarray(v).reshape(()) for v in (a_zero, a_scale, b_zero, b_scale, c_scale, c_zero)]
        return np.array([*scalars, self.low, self.high], np.float32)

    def execute(self, inputs, outputs=None):
        a, b = (np.asarray(inputs[i], order="C") for i in self.operands)
        params = self.params(*(inputs[i] for i in self.parameters))
        out = np.empty(a.shape, self.dtype) if outputs is None else outputs[0]
        bounds = self.bounds(a.size)
        args = (bounds, a.reshape(-1), b.reshape(-1), params, out.reshape(-1))
        self.slices.run(bounds.shape[0] - 1, args)
        return [out]
