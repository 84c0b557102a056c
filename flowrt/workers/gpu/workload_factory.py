"""GpuAcc workloads: a prepared kernel per layer, run on the device's in-order queue."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from flowrt.errors import BackendError
from flowrt.registry import WorkloadInfo
from flowrt.workers.gpu.context import DeviceContext
from flowrt.workers.gpu.kernels import GpuKernel, load_all
from flowrt.workers.gpu.kernels.activation import enqueue_activation
from flowrt.workers.gpu.tensor import GpuTensor


class GpuWorkload:
    """One layer on the device. ``execute`` takes numpy arrays or GpuTensors (a host array is
    uploaded here), returns GpuTensors, and blocks until its commands have run.

    Constant inputs (weights) are uploaded once by ``prepare``; the host copies the executor
    passes for them are not read again.
    """

    def __init__(self, kernel: GpuKernel) -> None:
        self.kernel = kernel
        self.info = kernel.info
        self.context: DeviceContext = kernel.context
        self.device_constants: dict[int, GpuTensor] = {}

    def prepare(self) -> None:
        self.kernel.prepare()
        for i, value in enumerate(self.info.constants):
            if value is not None and i not in self.kernel.host_inputs:
                self.device_constants[i] = self.context.upload(value)
        self.activation_kernel = None
        if self.info.activation is not None and not self.kernel.fuses_activation:
            self.activation_kernel = self.context.kernel("elementwise", "activation")

    def execute(self, inputs: Sequence[Any]) -> list[GpuTensor]:
        args = [self._argument(i, x) for i, x in enumerate(inputs)]
        with self.kernel.lock:
            outputs, event = self.kernel.enqueue(args)
            if self.activation_kernel is not None:
                # Into a new tensor: the output may be a view of an input.
                activated = self.context.empty(outputs[0].shape)
                event = enqueue_activation(
                    self.activation_kernel, outputs[0], activated, self.info.activation
                )  # type: ignore[arg-type]
                outputs = [activated, *outputs[1:]]
        if event is not None:
            event.wait()
        return outputs

    def _argument(self, index: int, value: Any) -> Any:
        if value is None or index in self.kernel.host_inputs:
            return value
        if index in self.device_constants:
            return self.device_constants[index]
        if isinstance(value, GpuTensor):
            return value
        return self.context.upload(np.asarray(value))


class GpuWorkloadFactory:
    """Makes GpuAcc workloads on one device."""

    def __init__(self, memory_manager: Any, context: DeviceContext) -> None:
        self.memory_manager = memory_manager
        self.context = context

    def create_workload(self, info: WorkloadInfo) -> GpuWorkload:
        kernel = load_all().get(info.kind)
        if kernel is None:
            raise BackendError(f"GpuAcc has no kernel for layer {info.layer_name!r} ({info.kind})")
        return GpuWorkload(kernel(info, self.context))
