"""Slice and Split: the output read through the input's strides (times the steps) from the
first element it takes, by layout.cl's ``transpose`` gather with the input's offset moved
there, one launch an output (a Split's outputs that lie in one buffer: layout.cl's
``split_many``, one launch); Gather: layout.cl's ``gather_rows``, one
launch."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from flowrt.engine.graph.layers.reshape import const_ints
from flowrt.engine.graph.layers.slice import slice_params
from flowrt.engine.graph.shapes import normalize_axis
from flowrt.errors import ShapeError
from flowrt.registry import Support, WorkloadInfo
from flowrt.workers.gpu.kernels import RANK, GpuKernel, gpu_kernel, ints, static_shape
from flowrt.workers.gpu.kernels.elementwise import stride_table
from flowrt.workers.gpu.kernels.layout import CONCAT_INPUTS
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
    so the split input is not read). Up to CONCAT_INPUTS outputs that lie in one buffer (a
    memory pool's tensors do: GPT-2's Q, K and V out of its fused projection) are written in
    one launch that reads the input once, in order; others one launch each."""

    host_inputs = frozenset({1})

    def prepare(self) -> None:
        self.kernel = self.context.kernel("layout", "transpose", self.storage)
        self.many = self.context.kernel("layout", "split_many", self.storage)
        shape = static_shape(self.info.inputs[0])
        axis = normalize_axis(self.info.descriptor.axis, len(shape), "Split")
        strides = _strides(shape)
        self.parts = []
        start = 0
        for out in self.output_shapes:
            self.parts.append((start * strides[axis], stride_table(self.context, out, _padded(strides))))
            start += out[axis]
        # Each output's values per slab of the input (the split axis and the dims after it).
        self.blocks = [out[axis] * strides[axis] for out in self.output_shapes]
        self.total = shape[axis] * strides[axis]

    def enqueue(self, queue: Any, inputs: Sequence[Any], outputs: Sequence[GpuTensor]) -> Any:
        x, ys = inputs[0], list(outputs)
        if 1 < len(ys) <= CONCAT_INPUTS and x.size and all(y.buffer is ys[0].buffer for y in ys):
            # One launch reading the input in order, each value to its output's place.
            table = [
                v for y, block in zip(ys, self.blocks, strict=True) for v in (int(y.kernel_args[1]), block, 0)
            ]
            table += [0] * (3 * CONCAT_INPUTS - len(table))
            return self.launch(self.many, queue, x.size, *x.kernel_args, ys[0].buffer,
                               *ints(self.total, x.size, len(ys), *table))  # fmt: skip
        event = None
        for (first, table), y in zip(self.parts, ys, strict=True):
            event = self.gather(queue, x, y, first, table)
        return event


# The scratch slot a Gather's indices read at each run go to (see ``DeviceContext.scratch``).
GATHER_SLOT = 2


@gpu_kernel("Gather")
class GatherKernel(GpuKernel):
    """Gather along any axis, one launch (layout.cl's ``gather_rows``) whatever the number of
    indices: a scalar index (ViT's ``qkv[0]``), a token embedding's lookup of a sequence. The
    indices are checked on the host and given to the kernel as an int32 buffer: a constant's
    once at load, others each run, written into the submission's scratch (those runs'
    launches are then not recorded)."""

    host_inputs = frozenset({1})
    half_storage = True

    @classmethod
    def supports(cls, info: WorkloadInfo) -> Support:
        indices = info.inputs[1]
        if indices is None or indices.shape is None or not indices.is_static:
            return Support.no("GpuAcc gathers by indices of a static shape")
        return Support.yes()

    def prepare(self) -> None:
        self.kernel = self.context.kernel("layout", "gather_rows", self.storage)
        shape = static_shape(self.info.inputs[0])
        self.axis = normalize_axis(self.info.descriptor.axis, len(shape), "Gather")
        self.dim = shape[self.axis]
        self.slab = int(np.prod(shape[self.axis + 1 :], dtype=np.int64))
        self.count = int(np.prod(static_shape(self.info.inputs[1]), dtype=np.int64))
        constant = self.constant(1)
        self.fixed = None if constant is None else self.context.upload(self._indices(constant), np.int32)

    def _indices(self, given: Any) -> np.ndarray:
        """The indices as int32, each made non-negative; ShapeError for one out of range."""
        indices = np.asarray(given).astype(np.int64, copy=False).reshape(-1)
        indices = np.where(indices < 0, indices + self.dim, indices)
        if indices.size and (indices.min() < 0 or indices.max() >= self.dim):
            found = np.asarray(given).reshape(-1)
            bad = found[(found < -self.dim) | (found >= self.dim)]
            raise ShapeError(
                f"Gather: indices must lie in [-{self.dim}, {self.dim}) along axis {self.axis}, "
                f"found {bad[:8].tolist()}{' ...' if bad.size > 8 else ''}"
            )
        return indices.astype(np.int32)

    def enqueue(self, queue: Any, inputs: Sequence[Any], outputs: Sequence[GpuTensor]) -> Any:
        indices = self.fixed
        if indices is None:
            refuse("Gather indices read at each run")
            host = self._indices(inputs[1])
            indices = self.context.scratch((self.count,), slot=GATHER_SLOT, dtype=np.int32)
            self.context.enqueue_write(queue, indices, host)
        x, y = inputs[0], outputs[0]
        return self.launch(
            self.kernel, queue, y.size, *x.kernel_args, *y.kernel_args, *indices.kernel_args,
            np.int32(self.count), np.int32(self.slab), np.int32(self.dim), np.int32(y.size),
        )  # fmt: skip
