"""Slice, Split and Gather: the output read through the input's strides (times the steps)
from the first element it takes, by layout.cl's ``transpose`` gather with the input's offset
moved there. Each output is one launch (a Gather's, one per index)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from flowrt.engine.graph.layers.reshape import const_ints
from flowrt.engine.graph.layers.slice import slice_params
from flowrt.engine.graph.shapes import normalize_axis
from flowrt.errors import ShapeError
from flowrt.registry import Support, WorkloadInfo
from flowrt.workers.gpu.kernels import RANK, GpuKernel, gpu_kernel, static_shape
from flowrt.workers.gpu.kernels.elementwise import stride_table
from flowrt.workers.gpu.launches import refuse
from flowrt.workers.gpu.tensor import GpuTensor


def _strides(shape: Sequence[int]) -> list[int]:
    """Element strides of a C-contiguous ``shape``."""
    strides, step = [0] * len(shape), 1
    for d in range(len(shape) - 1, -1, -1):
        strides[d] = step
        step *= shape[d]
    return strides


def _padded(strides: Sequence[int]) -> list[int]:
    return [0] * (RANK - len(strides)) + list(strides)


class _Gather(GpuKernel):
    """Enqueues ``y[i] = x[first + strided_offset(i, table)]`` for each output."""

    kernel: Any  # layout.cl's transpose, made in prepare
    half_storage = True

    @classmethod
    def supports(cls, info: WorkloadInfo) -> Support:
        if len(static_shape(info.inputs[0])) > RANK:
            return Support.no(f"GpuAcc slices tensors of rank {RANK} or less")
        return Support.yes()

    def gather(
        self, queue: Any, x: GpuTensor, y: GpuTensor, first: int, table: Any, at: int = 0, size: int = 0
    ) -> Any:
        """``size`` elements of ``y`` from its element ``at`` (default: all of it)."""
        offset = np.int32(int(x.kernel_args[1]) + first)
        size = size or y.size
        y_offset = np.int32(int(y.kernel_args[1]) + at)
        return self.launch(
            self.kernel, queue, size, x.buffer, offset, y.buffer, y_offset, table, np.int32(size)
        )


@gpu_kernel("Slice")
class SliceKernel(_Gather):
    """Starts, ends, axes and steps are attributes before opset 10, else inputs 1 to 4, read
    on the host: constants once at load, others at each run (a run's launches are then not
    recorded: the next run's may differ)."""

    host_inputs = frozenset({1, 2, 3, 4})

    def prepare(self) -> None:
        self.kernel = self.context.kernel("layout", "transpose", self.storage)
        self.shape = static_shape(self.info.inputs[0])
        self.tables: dict[tuple, tuple[int, Any]] = {}
        given = range(1, len(self.info.inputs))
        constant = all(self.constant(i) is not None for i in given if self.info.inputs[i] is not None)
        self.fixed = self.plan([self.constant(i) for i in given]) if constant else None

    def plan(self, values: Sequence[Any]) -> tuple[int, Any]:
        """(first element, stride table) of the slice the parameter values ``values`` (inputs 1
        to 4, None where absent) name; made once per distinct parameters."""
        params = slice_params(self.info.descriptor, [const_ints(v) for v in values])
        assert params is not None  # shape inference found starts and ends
        key = tuple(tuple(p) for p in params)
        found = self.tables.get(key)
        if found is None:
            strides = _strides(self.shape)
            read, first = list(strides), 0
            for start, end, axis, step in zip(*params, strict=True):
                a = normalize_axis(axis, len(self.shape), "Slice")
                picked = range(*slice(start, end, step).indices(self.shape[a]))
                first += picked.start * strides[a]
                read[a] = strides[a] * step
            found = self.tables[key] = (
                first,
                stride_table(self.context, self.output_shapes[0], _padded(read)),
            )
        return found

    def enqueue(self, queue: Any, inputs: Sequence[Any], outputs: Sequence[GpuTensor]) -> Any:
        if self.fixed is not None:
            first, table = self.fixed
        else:
            refuse("Slice parameters read at each run")
            first, table = self.plan([None if v is None else np.asarray(v) for v in inputs[1:]])
        return self.gather(queue, inputs[0], outputs[0], first, table)


@gpu_kernel("Split")
class SplitKernel(_Gather):
    """Each output is the next run of the axis (their lengths are the outputs' static shapes,
    so the split input is not read)."""

    host_inputs = frozenset({1})

    def prepare(self) -> None:
        self.kernel = self.context.kernel("layout", "transpose", self.storage)
        shape = static_shape(self.info.inputs[0])
        axis = normalize_axis(self.info.descriptor.axis, len(shape), "Split")
        strides = _strides(shape)
        self.parts = []
        start = 0
        for out in self.output_shapes:
            self.parts.append((start * strides[axis], stride_table(self.context, out, _padded(strides))))
            start += out[axis]

    def enqueue(self, queue: Any, inputs: Sequence[Any], outputs: Sequence[GpuTensor]) -> Any:
        event = None
        for (first, table), y in zip(self.parts, outputs, strict=True):
            event = self.gather(queue, inputs[0], y, first, table)
        return event


# A Gather's indices are this many launches at most (one each).
GATHER_INDICES = 16


@gpu_kernel("Gather")
class GatherKernel(_Gather):
    """Gather along an axis, each index's slab one launch: a scalar index (Swin's and ViT's
    ``qkv[0]``), or up to GATHER_INDICES along an axis with nothing before it, where each
    slab lies whole in the output. The indices are read on the host: a constant once at
    load, others at each run (those runs' launches are then not recorded)."""

    host_inputs = frozenset({1})

    @classmethod
    def supports(cls, info: WorkloadInfo) -> Support:
        found = super().supports(info)
        if not found.supported:
            return found
        shape, indices = static_shape(info.inputs[0]), info.inputs[1]
        if indices is None or indices.shape is None or not indices.is_static:
            return Support.no("GpuAcc gathers by indices of a static shape")
        count = int(np.prod(static_shape(indices), dtype=np.int64))
        axis = info.descriptor.axis % len(shape)
        if count > GATHER_INDICES:
            return Support.no(f"GpuAcc gathers {GATHER_INDICES} indices at most, found {count}")
        if count > 1 and any(d != 1 for d in shape[:axis]):
            return Support.no("GpuAcc gathers several indices only along an axis with nothing before it")
        return Support.yes()

    def prepare(self) -> None:
        self.kernel = self.context.kernel("layout", "transpose", self.storage)
        shape = static_shape(self.info.inputs[0])
        self.axis = self.info.descriptor.axis % len(shape)
        self.dim = shape[self.axis]
        strides = _strides(shape)
        self.step = strides[self.axis]
        slab = [d for i, d in enumerate(shape) if i != self.axis]
        read = [s for i, s in enumerate(strides) if i != self.axis]
        self.slab = int(np.prod(slab, dtype=np.int64))
        self.table = stride_table(self.context, slab, _padded(read))
        constant = self.constant(1)
        self.fixed = None if constant is None else self._indices(constant)

    def _indices(self, given: Any) -> np.ndarray:
        indices = np.asarray(given).astype(np.int64, copy=False).reshape(-1)
        indices = np.where(indices < 0, indices + self.dim, indices)
        if indices.size and (indices.min() < 0 or indices.max() >= self.dim):
            raise ShapeError(
                f"Gather: indices must lie in [-{self.dim}, {self.dim}) along axis {self.axis}, "
                f"found {np.asarray(given).reshape(-1).tolist()}"
            )
        return indices

    def enqueue(self, queue: Any, inputs: Sequence[Any], outputs: Sequence[GpuTensor]) -> Any:
        indices = self.fixed
        if indices is None:
            refuse("Gather indices read at each run")
            indices = self._indices(inputs[1])
        event = None
        for k, index in enumerate(indices):
            first = int(index) * self.step
            event = self.gather(queue, inputs[0], outputs[0], first, self.table, k * self.slab, self.slab)
        return event
