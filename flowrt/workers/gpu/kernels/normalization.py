"""BatchNormalization (inference), LRN and Softmax."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from flowrt.registry import Support, WorkloadInfo
from flowrt.workers.gpu.kernels import LOCAL_SIZE, GpuKernel, activation_args, global_size, gpu_kernel, ints
from flowrt.workers.gpu.tensor import GpuTensor


def channel_layout(shape: Sequence[int]) -> tuple[int, int]:
    """(channels, cells per channel) of an N, C, ... tensor."""
    return shape[1], int(np.prod(shape[2:], dtype=np.int64))


@gpu_kernel("BatchNormalization")
class BatchNormalizationKernel(GpuKernel):
    """y = act(x * factor[c] + shift[c]), the four parameters folded on the host (at load when
    they are constants, as they are in every exported model)."""

    host_inputs = frozenset({1, 2, 3, 4})
    fuses_activation = True

    @classmethod
    def supports(cls, info: WorkloadInfo) -> Support:
        desc = info.descriptor
        if desc.training or len(info.outputs) != 1:
            return Support.no("GpuAcc runs BatchNormalization in inference mode only")
        if not desc.spatial:
            return Support.no("GpuAcc runs per-channel (spatial) BatchNormalization only")
        return Support.yes()

    def prepare(self) -> None:
        self.kernel = self.context.kernel("normalization", "scale_shift")
        params = [self.constant(i) for i in range(1, 5)]
        self.folded = self._fold(params) if all(p is not None for p in params) else None

    def _fold(self, params: Sequence[Any]) -> tuple[GpuTensor, GpuTensor]:
        scale, bias, mean, var = (np.asarray(p, np.float32).reshape(-1) for p in params)
        factor = scale / np.sqrt(var + np.float32(self.info.descriptor.epsilon))
        return self.context.upload(factor), self.context.upload(bias - mean * factor)

    def enqueue(self, queue: Any, inputs: Sequence[Any], outputs: Sequence[GpuTensor]) -> Any:
        x, y = inputs[0], outputs[0]
        factor, shift = self.folded or self._fold(inputs[1:5])
        return self.kernel(
            queue, global_size(x.size), (LOCAL_SIZE,), x.buffer, y.buffer, factor.buffer, shift.buffer,
            *ints(*channel_layout(x.shape), x.size), *activation_args(self.info.activation),
        )  # fmt: skip


@gpu_kernel("LRN")
class LRNKernel(GpuKernel):
    """Local response normalization across channels."""

    def prepare(self) -> None:
        self.kernel = self.context.kernel("normalization", "lrn")

    def enqueue(self, queue: Any, inputs: Sequence[GpuTensor], outputs: Sequence[GpuTensor]) -> Any:
        x, y, desc = inputs[0], outputs[0], self.info.descriptor
        channels, inner = channel_layout(x.shape)
        return self.kernel(
            queue, global_size(x.size), (LOCAL_SIZE,), x.buffer, y.buffer,
            *ints(channels, inner, desc.size), np.float32(desc.alpha / desc.size),
            np.float32(desc.beta), np.float32(desc.bias), np.int32(x.size),
        )  # fmt: skip


@gpu_kernel("Softmax")
class SoftmaxKernel(GpuKernel):
    """Softmax along an axis (through the 2-D view before opset 13), shifted by the row max."""

    def prepare(self) -> None:
        self.kernel = self.context.kernel("normalization", "softmax")
        shape = self.output_shapes[0]
        desc = self.info.descriptor
        axis = desc.resolved_axis(len(shape), "Softmax")
        if desc.coerces_to_2d:
            length, inner = int(np.prod(shape[axis:], dtype=np.int64)), 1
        else:
            length, inner = shape[axis], int(np.prod(shape[axis + 1 :], dtype=np.int64))
        self.rows = int(np.prod(shape, dtype=np.int64)) // max(length, 1)
        self.args = ints(length, inner, self.rows)

    def enqueue(self, queue: Any, inputs: Sequence[GpuTensor], outputs: Sequence[GpuTensor]) -> Any:
        x, y = inputs[0], outputs[0]
        return self.kernel(queue, global_size(self.rows), (LOCAL_SIZE,), x.buffer, y.buffer, *self.args)
