"""Concat, Transpose, Expand, and the view kinds (Reshape, Flatten, Squeeze, Unsqueeze)."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import numpy as np

from flowrt.engine.graph.layers.transpose import moves_data, transpose_perm
from flowrt.registry import Support, WorkloadInfo
from flowrt.workers.gpu.kernels import (
    RANK,
    GpuKernel,
    gpu_kernel,
    ints,
    static_shape,
)
from flowrt.workers.gpu.kernels.elementwise import broadcast_strides, stride_table
from flowrt.workers.gpu.tensor import GpuTensor

CONCAT_INPUTS = 16  # layout.cl's concat_many takes this many inputs at most


@gpu_kernel("Concat")
class ConcatKernel(GpuKernel):
    """Each input copied into its slab of the output: ``outer`` slabs of ``axis * inner``
    values, placed ``axis_len * inner`` apart. Inputs that lie in one buffer (a memory pool's
    tensors do) are copied together, up to CONCAT_INPUTS a launch; an input its producer wrote
    in place is not copied."""

    half_storage = True

    def prepare(self) -> None:
        self.kernel = self.context.kernel("layout", "concat_slab", self.storage)
        self.many = self.context.kernel("layout", "concat_many", self.storage)
        out = self.output_shapes[0]
        axis = self.info.descriptor.concat_axis % len(out)
        self.inner = int(np.prod(out[axis + 1 :], dtype=np.int64))
        self.pitch = out[axis] * self.inner
        self.outer = int(np.prod(out[:axis], dtype=np.int64))
        self.axis = axis

    def enqueue(self, queue: Any, inputs: Sequence[GpuTensor], outputs: Sequence[GpuTensor]) -> Any:
        y = outputs[0]
        start = 0
        one_slab = y.size == self.pitch
        by_buffer: dict[Any, list[tuple[GpuTensor, int, int]]] = {}
        for x in inputs:
            block = x.shape[self.axis] * self.inner
            in_place = one_slab and x.buffer is y.buffer and x.offset == y.offset + start * y.dtype.itemsize
            # An input its producer wrote into its slab in place (the planner's Concat parts)
            # is there already.
            if x.size and not in_place:
                by_buffer.setdefault(x.buffer, []).append((x, block, start))
            start += block
        event = None
        for parts in by_buffer.values():
            for first in range(0, len(parts), CONCAT_INPUTS):
                event = self._copy(queue, parts[first : first + CONCAT_INPUTS], y)
        return event

    def _copy(self, queue: Any, parts: list[tuple[GpuTensor, int, int]], y: GpuTensor) -> Any:
        """Copy ``parts`` (input, block, start), all in one buffer, into their slabs of ``y``."""
        if len(parts) == 1:
            x, block, start = parts[0]
            return self.launch(self.kernel, queue, x.size, *x.kernel_args, *y.kernel_args,
                               *ints(block, self.pitch, start, x.size))  # fmt: skip
        total = sum(block for _, block, _ in parts)
        table = [v for x, block, start in parts for v in (x.offset // x.dtype.itemsize, block, start)]
        table += [0] * (3 * CONCAT_INPUTS - len(table))
        n = self.outer * total
        return self.launch(self.many, queue, n, parts[0][0].buffer, y.buffer,
                           *ints(y.offset // y.dtype.itemsize, self.pitch, total, n, len(parts), *table))  # fmt: skip


@gpu_kernel("Transpose")
class TransposeKernel(GpuKernel):
    """A gather through the permuted input strides; a view, no command, where only axes of
    size 1 move (a batch of 1 swapped with the sequence: ``(1, S, D) -> (S, 1, D)``)."""

    half_storage = True

    @functools.cached_property
    def is_view(self) -> bool:  # type: ignore[override]  # per shape, not per class
        shape = static_shape(self.info.inputs[0])
        return not moves_data(shape, transpose_perm(self.info.descriptor.perm, len(shape)))

    def view(self, inputs: Sequence[Any]) -> list[GpuTensor]:
        return [inputs[0].reshape(self.output_shapes[0])]

    @classmethod
    def supports(cls, info: WorkloadInfo) -> Support:
        if len(static_shape(info.inputs[0])) > RANK:
            return Support.no(f"GpuAcc transposes tensors of rank {RANK} or less")
        return Support.yes()

    def prepare(self) -> None:
        shape = static_shape(self.info.inputs[0])
        perm = transpose_perm(self.info.descriptor.perm, len(shape))
        strides = broadcast_strides(shape, shape)[RANK - len(shape) :]
        # Dims of size 1 got stride 0 above, which is right for them too.
        permuted = [0] * (RANK - len(shape)) + [strides[p] for p in perm]
        self._gather(permuted)

    def _gather(self, strides: Sequence[int]) -> None:
        """The kernel reading the output's elements through the input's ``strides`` (rank
        RANK, in output order): runs along the last dim where it is read in order."""
        out = self.output_shapes[0]
        self.table = stride_table(self.context, out, strides)
        last = out[-1] if out else 1
        self.run = next((r for r in (8, 4, 2) if strides[-1] == 1 and last % r == 0), 1)
        name = "transpose_runs" if self.run > 1 else "transpose"
        self.kernel = self.context.kernel("layout", name, self.storage)

    def enqueue(self, queue: Any, inputs: Sequence[GpuTensor], outputs: Sequence[GpuTensor]) -> Any:
        x, y = inputs[0], outputs[0]
        runs = (np.int32(self.run),) if self.run > 1 else ()
        return self.launch(
            self.kernel, queue, y.size // self.run, *x.kernel_args, *y.kernel_args, self.table, *runs,
            np.int32(y.size // self.run),
        )  # fmt: skip


@gpu_kernel("Expand")
class ExpandKernel(TransposeKernel):
    """A gather through the input's broadcast strides (0 along every dim it repeats): the
    transpose kernel with the strides of broadcasting in place of a permutation. The target
    shape is read at load (the output's static shape)."""

    host_inputs = frozenset({1})  # the target shape
    is_view = False  # a gather at every shape

    @classmethod
    def supports(cls, info: WorkloadInfo) -> Support:
        if len(static_shape(info.outputs[0])) > RANK:
            return Support.no(f"GpuAcc expands to tensors of rank {RANK} or less")
        return Support.yes()

    def prepare(self) -> None:
        self._gather(broadcast_strides(static_shape(self.info.inputs[0]), self.output_shapes[0]))


@gpu_kernel("Reshape", "Flatten", "Squeeze", "Unsqueeze")
class ViewKernel(GpuKernel):
    """The input's buffer with the output's shape (known at load): no copy, no command."""

    host_inputs = frozenset({1})  # Reshape's shape, Squeeze's and Unsqueeze's axes
    is_view = True
    half_storage = True

    def view(self, inputs: Sequence[Any]) -> list[GpuTensor]:
        return [inputs[0].reshape(self.output_shapes[0])]
