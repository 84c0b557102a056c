"""Split along any axis into pieces of the lengths given (attribute or constant input) or
equal ones, any data type of 1, 2, 4 or 8 bytes.

Each piece is the input read from its offset along the axis: one ``strided.StridedCopy`` per
output, planned once per input shape and lengths (the lengths are constants in most exports,
read once at load). A transformer's fused QKV projection, ``(B, S, 3H)`` cut on its last axis,
is three copies of ``B*S`` rows of ``H`` elements.
"""

from __future__ import annotations

import numpy as np

from flowrt.engine.graph.layers.concat import resolve_split
from flowrt.engine.graph.shapes import normalize_axis
from flowrt.errors import BackendError
from flowrt.registry import Support, WorkloadInfo
from flowrt.workers.cpu.acc.kernels import acc_kernel
from flowrt.workers.cpu.acc.kernels.shape_inputs import ShapeInputs, Values
from flowrt.workers.cpu.acc.kernels.strided import (
    StridedCopy,
    as_words,
    contiguous_strides,
    movable_data,
)


@acc_kernel("Split")
class SplitKernel:
    """Split as one strided copy per output, each split into row slices across the CPU workers."""

    @classmethod
    def supports(cls, info: WorkloadInfo) -> Support:
        return movable_data(info)

    def __init__(self, info: WorkloadInfo, workers: int) -> None:
        if info.activation is not None:
            raise BackendError(f"CpuAcc Split {info.layer_name!r} cannot apply a fused activation")
        self.info = info
        self.workers = workers
        self.shape_inputs = ShapeInputs(info, 1)
        self._copies: dict[tuple[tuple[int, ...], Values], list[StridedCopy]] = {}

    def copies(self, shape: tuple[int, ...], values: Values) -> list[StridedCopy]:
        """One copy per output for an input shape and the lengths input (planned once per pair)."""
        key = (shape, values)
        cached = self._copies.get(key)
        if cached is None:
            desc = self.info.descriptor
            axis = normalize_axis(desc.axis, len(shape), "Split")
            given = values[0] if values else None
            own = contiguous_strides(shape)
            cached, offset = [], 0
            for length in resolve_split(desc, None if given is None else list(given), shape[axis]):
                piece = shape[:axis] + (length,) + shape[axis + 1 :]
                cached.append(StridedCopy(piece, own, offset * own[axis], self.workers))
                offset += length
            self._copies[key] = cached
        return cached

    def execute(self, inputs, outputs=None):
        x = np.asarray(inputs[0], order="C")
        copies = self.copies(x.shape, self.shape_inputs.values(inputs))
        if outputs is None:
            outputs = [np.empty(c.shape, x.dtype) for c in copies]
        words = as_words(x)
        for copy, out in zip(copies, outputs, strict=True):
            if out.size:
                copy.run(words, as_words(out))
        return list(outputs)
