"""Slice: any axes, negative steps, ONNX's clamping, any data type of 1, 2, 4 or 8 bytes.

A slice is a strided view of its input: each sliced axis starts at its clamped start and
steps ``step`` times the axis stride (backwards for a negative step). The output is that view
copied by ``strided.StridedCopy``, planned once per input shape and starts/ends/axes/steps;
those are constants in most exports, read once at load.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from flowrt.engine.graph.layers.slice import slice_params
from flowrt.engine.graph.shapes import normalize_axis
from flowrt.errors import BackendError, ShapeError
from flowrt.registry import Support, WorkloadInfo
from flowrt.workers.cpu.acc.kernels import acc_kernel
from flowrt.workers.cpu.acc.kernels.shape_inputs import ShapeInputs, Values
from flowrt.workers.cpu.acc.kernels.strided import (
    StridedCopy,
    as_words,
    contiguous_strides,
    movable_data,
)


def slice_copy(shape: Sequence[int], params: list, workers: int) -> StridedCopy:
    """The copy that slices ``shape`` by ``params`` = (starts, ends, axes, steps); a later
    entry for an axis wins, as in CpuRef."""
    own = contiguous_strides(shape)
    picked = {}
    for start, end, axis, step in zip(*params, strict=True):
        a = normalize_axis(axis, len(shape), "Slice")
        picked[a] = range(*slice(start, end, step).indices(shape[a]))  # Python's clamping is ONNX's
    out_shape = [len(picked[a]) if a in picked else n for a, n in enumerate(shape)]
    strides = [s * picked[a].step if a in picked else s for a, s in enumerate(own)]
    base = sum(r.start * own[a] for a, r in picked.items())
    return StridedCopy(out_shape, strides, base, workers)


@acc_kernel("Slice")
class SliceKernel:
    """Slice as one strided copy, split into row slices across the CPU workers."""

    @classmethod
    def supports(cls, info: WorkloadInfo) -> Support:
        return movable_data(info)

    def __init__(self, info: WorkloadInfo, workers: int) -> None:
        if info.activation is not None:
            raise BackendError(f"CpuAcc Slice {info.layer_name!r} cannot apply a fused activation")
        self.info = info
        self.workers = workers
        self.shape_inputs = ShapeInputs(info, 1)
        self._copies: dict[tuple[tuple[int, ...], Values], StridedCopy] = {}

    def copy(self, shape: tuple[int, ...], values: Values) -> StridedCopy:
        """The copy for an input shape and the values of inputs 1..4 (planned once per pair)."""
        key = (shape, values)
        cached = self._copies.get(key)
        if cached is None:
            params = slice_params(self.info.descriptor, [None if v is None else list(v) for v in values])
            if params is None:
                raise ShapeError(f"Slice {self.info.layer_name!r}: starts and ends expected, found none")
            cached = self._copies[key] = slice_copy(shape, params, self.workers)
        return cached

    def execute(self, inputs, outputs=None):
        x = np.asarray(inputs[0], order="C")
        copy = self.copy(x.shape, self.shape_inputs.values(inputs))
        out = np.empty(copy.shape, x.dtype) if outputs is None else outputs[0]
        if out.size:
            copy.run(as_words(x), as_words(out))
        return [out]
