"""Reduce* over any set of axes (reduction.cl's ``reduce``), one work-item per output value.

Each output value starts at the input offset of its kept coordinates and reads the reduced
ones through a second stride table; when the reduced axes are the trailing ones the values
are contiguous and the kernel skips the table, and where there are enough of them (a
transformer's RMSNorm reduces rows of hundreds) a work-group takes each output
(``reduce_rows``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from flowrt.engine.graph.layers.reduce import reduce_axes
from flowrt.engine.graph.layers.reshape import const_ints
from flowrt.errors import BackendError
from flowrt.workers.gpu.kernels import RANK, GpuKernel, gpu_kernel, ints, row_group, static_shape
from flowrt.workers.gpu.kernels.elementwise import broadcast_strides, stride_table
from flowrt.workers.gpu.tensor import GpuTensor

# The codes of reduction.cl's reduce_step() and reduce_finish().
REDUCE_CODES = {
    "ReduceSum": 0, "ReduceMean": 1, "ReduceMax": 2, "ReduceMin": 3, "ReduceProd": 4,
    "ReduceL1": 5, "ReduceL2": 6, "ReduceSumSquare": 7, "ReduceLogSum": 8, "ReduceLogSumExp": 9,
}  # fmt: skip


def split_strides(
    shape: Sequence[int], axes: Sequence[int]
) -> tuple[list[int], list[int], list[int], list[int]]:
    """(kept dims, their input strides, reduced dims, their input strides) of a C-contiguous
    ``shape``; a dim of 1 reads with stride 0, which is right for it too."""
    strides = broadcast_strides(shape, shape)[RANK - len(shape) :]
    kept = [d for d in range(len(shape)) if d not in axes]
    return (
        [shape[d] for d in kept],
        [strides[d] for d in kept],
        [shape[d] for d in axes],
        [strides[d] for d in axes],
    )


def padded(values: Sequence[int], fill: int) -> list[int]:
    """``values`` led by ``fill`` up to rank ``RANK``, as strided_offset reads them."""
    return [fill] * (RANK - len(values)) + list(values)


@gpu_kernel(*REDUCE_CODES)
class ReduceKernel(GpuKernel):
    """Reduce* over the axes of the attribute or of the (constant) axes input."""

    host_inputs = frozenset({1})

    def prepare(self) -> None:
        self.kernel = self.context.kernel("reduction", "reduce")
        shape = static_shape(self.info.inputs[0])
        has_axes = len(self.info.inputs) > 1 and self.info.inputs[1] is not None
        axes_value = self.constant(1) if has_axes else None
        if has_axes and axes_value is None and self.info.descriptor.axes is None:
            raise BackendError(
                f"GpuAcc {self.info.kind} {self.info.layer_name!r} expects constant axes, "
                "found an axes input computed at run time"
            )
        axes = reduce_axes(self.info.descriptor, len(shape), const_ints(axes_value), self.info.kind)
        kept_dims, kept_strides, reduced_dims, reduced_strides = split_strides(shape, axes)
        self.kept = stride_table(self.context, kept_dims, padded(kept_strides, 0))
        self.reduced = stride_table(self.context, reduced_dims, padded(reduced_strides, 0))
        self.count = int(np.prod(reduced_dims, dtype=np.int64))
        trailing = tuple(axes) == tuple(range(len(shape) - len(axes), len(shape)))
        self.contiguous = np.int32(trailing)
        self.op = np.int32(REDUCE_CODES[self.info.kind])
        self.group = row_group(self.count, self.context.device) if trailing else None
        if self.group is not None:
            self.kernel = self.context.kernel("reduction", "reduce_rows")

    def enqueue(self, queue: Any, inputs: Sequence[Any], outputs: Sequence[GpuTensor]) -> Any:
        x, y = inputs[0], outputs[0]
        if self.group is not None:
            return self.launch_rows(
                self.kernel, queue, y.size, self.group, *x.kernel_args, *y.kernel_args, self.kept,
                *ints(self.count, y.size), self.op,
            )  # fmt: skip
        return self.launch(
            self.kernel, queue, y.size, *x.kernel_args, *y.kernel_args, self.kept, self.reduced,
            *ints(self.count), self.contiguous, *ints(y.size), self.op,
        )  # fmt: skip
