"""MaxPool, AveragePool (2-D) and GlobalAveragePool; the window geometry is CpuRef's."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from flowrt.engine.graph.layers.pooling import pool_geometry
from flowrt.registry import Support, WorkloadInfo
from flowrt.workers.gpu.kernels import GpuKernel, gpu_kernel, ints, static_shape
from flowrt.workers.gpu.tensor import GpuTensor


class _Pool(GpuKernel):
    function = ""
    half_storage = True

    @classmethod
    def supports(cls, info: WorkloadInfo) -> Support:
        if len(static_shape(info.inputs[0])) != 4:
            return Support.no(f"GpuAcc runs 2-D {info.kind} only")
        if len(info.outputs) != 1:
            return Support.no(f"GpuAcc's {info.kind} has no indices output")
        return Support.yes()

    def prepare(self) -> None:
        self.kernel = self.context.kernel("pooling", self.function, self.storage)
        x_shape = static_shape(self.info.inputs[0])
        desc = self.info.descriptor
        g = pool_geometry(desc, x_shape[2:])
        total = int(np.prod(self.output_shapes[0]))
        self.args = ints(
            *x_shape[2:], *g.out, *desc.kernel_shape, *g.strides, *g.pads_begin, *g.dilations, total
        )
        self.geometry = g

    def enqueue(self, queue: Any, inputs: Sequence[GpuTensor], outputs: Sequence[GpuTensor]) -> Any:
        x, y = inputs[0], outputs[0]
        return self.launch(self.kernel, queue, y.size, *x.kernel_args, *y.kernel_args, *self.args)


@gpu_kernel("MaxPool")
class MaxPoolKernel(_Pool):
    """The largest value of each window."""

    function = "max_pool"


@gpu_kernel("AveragePool")
class AveragePoolKernel(_Pool):
    """The mean of each window; the divisor counts pad cells only with ``count_include_pad``."""

    function = "average_pool"

    def prepare(self) -> None:
        super().prepare()
        self.args += ints(self.info.descriptor.count_include_pad, *self.geometry.pads_end)


@gpu_kernel("GlobalAveragePool")
class GlobalAveragePoolKernel(GpuKernel):
    """The mean of each channel's spatial cells."""

    half_storage = True

    def prepare(self) -> None:
        self.kernel = self.context.kernel("pooling", "global_average_pool", self.storage)

    def enqueue(self, queue: Any, inputs: Sequence[GpuTensor], outputs: Sequence[GpuTensor]) -> Any:
        x, y = inputs[0], outputs[0]
        return self.launch(
            self.kernel, queue, y.size, *x.kernel_args, *y.kernel_args, *ints(x.size // y.size, y.size)
        )
