"""Expand and Tile: a tensor's data repeated to a larger shape, any data type of 1, 2, 4 or 8
bytes.

Both are one ``strided.StridedCopy`` that reads some input dimensions with stride 0. Expand
broadcasts (stride 0 where the input's dim is 1). Tile reads the output, of dims
``repeats[d] * shape[d]``, as ``(repeats[0], shape[0], repeats[1], shape[1], ...)`` with
stride 0 on each repeat. The target shape and the repeats are constants in most exports, read
once at load; a plan is made once per input shape and those values.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from flowrt.engine.graph.layers.tile import tile_repeats
from flowrt.engine.graph.shapes import broadcast_shapes
from flowrt.errors import BackendError, ShapeError
from flowrt.registry import Support, WorkloadInfo
from flowrt.types import static_dims
from flowrt.workers.cpu.acc.kernels import acc_kernel
from flowrt.workers.cpu.acc.kernels.shape_inputs import ShapeInputs, Values
from flowrt.workers.cpu.acc.kernels.strided import (
    StridedCopy,
    as_words,
    broadcast_strides,
    contiguous_strides,
    movable_data,
)


def expand_copy(shape: Sequence[int], values: Values, workers: int) -> tuple[tuple[int, ...], StridedCopy]:
    """Expand's output shape and copy: ``shape`` broadcast with the target ``values[0]``."""
    if values[0] is None:
        raise ShapeError("Expand: a target shape expected, found none")
    out_shape = static_dims(broadcast_shapes(shape, values[0], where="Expand"))  # of known shapes
    copy = StridedCopy(out_shape, broadcast_strides(shape, out_shape), 0, workers)
    return copy.shape, copy


def tile_copy(shape: Sequence[int], values: Values, workers: int) -> tuple[tuple[int, ...], StridedCopy]:
    """Tile's output shape and copy: ``shape`` repeated ``values[0]`` times per dim (one count
    on axis ``values[1]`` in opset 1's form)."""
    repeats, axis = values[0], values[1] if len(values) > 1 else None
    if repeats is None:
        raise ShapeError("Tile: repeats expected, found none")
    counts = tile_repeats(len(shape), list(repeats), None if axis is None else axis[0])
    views, strides = [], []
    for count, n, stride in zip(counts, shape, contiguous_strides(shape), strict=True):
        views += [count, n]
        strides += [0, stride]
    out_shape = tuple(c * n for c, n in zip(counts, shape, strict=True))
    return out_shape, StridedCopy(views, strides, 0, workers)


_PLANS = {"Expand": expand_copy, "Tile": tile_copy}


@acc_kernel(*_PLANS)
class RepeatKernel:
    """Expand or Tile as one strided copy, split into row slices across the CPU workers."""

    @classmethod
    def supports(cls, info: WorkloadInfo) -> Support:
        return movable_data(info)

    def __init__(self, info: WorkloadInfo, workers: int) -> None:
        if info.activation is not None:
            raise BackendError(f"CpuAcc {info.kind} {info.layer_name!r} cannot apply a fused activation")
        self.info = info
        self.workers = workers
        self.plan_of = _PLANS[info.kind]
        self.shape_inputs = ShapeInputs(info, 1)
        self._plans: dict[tuple[tuple[int, ...], Values], tuple[tuple[int, ...], StridedCopy]] = {}

    def plan(self, shape: tuple[int, ...], values: Values) -> tuple[tuple[int, ...], StridedCopy]:
        """The output shape and copy for an input shape and shape-like values (planned once)."""
        key = (shape, values)
        cached = self._plans.get(key)
        if cached is None:
            cached = self._plans[key] = self.plan_of(shape, values, self.workers)
        return cached

    def execute(self, inputs, outputs=None):
        x = np.asarray(inputs[0], order="C")
        shape, copy = self.plan(x.shape, self.shape_inputs.values(inputs))
        out = np.empty(shape, x.dtype) if outputs is None else outputs[0]
        if out.size:
            copy.run(as_words(x), as_words(out))
        return [out]
