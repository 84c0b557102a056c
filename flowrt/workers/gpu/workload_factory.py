"""GpuAcc workloads: a prepared kernel per layer, enqueued on an in-order queue."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from flowrt.errors import BackendError
from flowrt.registry import WorkloadInfo
from flowrt.workers.gpu.context import DeviceContext
from flowrt.workers.gpu.device import cl
from flowrt.workers.gpu.kernels import GpuKernel, load_all
from flowrt.workers.gpu.kernels.activation import enqueue_activation
from flowrt.workers.gpu.launches import BoundLaunches, bind, recording, refuse
from flowrt.workers.gpu.launches import enabled as launches_recorded
from flowrt.workers.gpu.scratch import current_scratch
from flowrt.workers.gpu.tensor import GpuTensor
from flowrt.workers.gpu.tuner import Tuner, tuning_progress


class GpuWorkload:
    """One layer on the device.

    ``enqueue(queue, inputs, outputs)`` is how the executor runs it: it puts the layer's
    commands on ``queue`` (in-order, so they run after whatever wrote the inputs) and returns
    at once. ``outputs``, when given, are the planned device tensors it writes (the pool's
    views; ``writes_in_place``); else it makes new ones. ``execute(inputs, outputs)`` is the
    blocking form on the device's own queue, taking numpy arrays too (uploaded here).

    Constant inputs (weights) are uploaded once by ``prepare``; the host copies the executor
    passes for them are not read again. The slots in ``host_inputs`` are read on the host.
    When its tuner tunes, ``prepare`` also runs the layer once on the tuner's profiling queue,
    on scratch tensors, which times the local sizes of the kernels it launches.
    """

    writes_in_place = True

    def __init__(self, kernel: GpuKernel) -> None:
        self.kernel = kernel
        self.info = kernel.info
        self.context: DeviceContext = kernel.context
        self.device_constants: dict[int, GpuTensor] = {}

    @property
    def host_inputs(self) -> frozenset[int]:
        return self.kernel.host_inputs

    @property
    def is_view(self) -> bool:
        """Whether the layer's output is a view of its first input (no command; the memory
        planner gives it no bytes of its own)."""
        return self.kernel.is_view

    def prepare(self) -> None:
        self.kernel.prepare()
        for i, value in enumerate(self.info.constants):
            if value is not None and i not in self.kernel.host_inputs:
                self.device_constants[i] = self.context.upload(value)
        self.activation_kernel = None
        if self.info.activation is not None and not self.kernel.fuses_activation:
            self.activation_kernel = self.context.kernel("elementwise", "activation", self.kernel.storage)
        if self.kernel.tuner.tunes and not self.kernel.is_view:
            self._tune()

    def _tune(self) -> None:
        """Run the layer on scratch tensors on the profiling queue (its kernels tune as they
        launch), then write the tuning file if that found something new."""
        tuner = self.kernel.tuner
        queue = tuner.profiling_queue(self.context)
        inputs = [self._scratch(i, info) for i, info in enumerate(self.info.inputs)]
        self.enqueue(queue, inputs)
        queue.finish()
        tuner.save()
        report = tuning_progress.get()
        if report is not None:
            report(self.info.layer_name)

    def _scratch(self, index: int, info: Any) -> Any:
        """A stand-in for input ``index`` while tuning: its constant, else ones."""
        if info is None:
            return None
        value = self.kernel.constant(index)
        if value is not None:
            return value
        return np.ones(tuple(info.shape), info.dtype.numpy)

    def enqueue(
        self, queue: Any, inputs: Sequence[Any], outputs: Sequence[GpuTensor] | None = None
    ) -> list[GpuTensor]:
        """Enqueue the layer on ``queue`` without waiting; return its output tensors."""
        args = [self._argument(i, x) for i, x in enumerate(inputs)]
        if self.kernel.is_view:
            views = self.kernel.view(args)
            if not outputs:
                return views
            refuse("a view's copy")
            # Planned memory of its own (a view of a feed): copy the bytes there.
            for view, target in zip(views, outputs):
                cl.enqueue_copy(queue, target.buffer, view.buffer, byte_count=target.nbytes,
                                src_offset=view.offset, dst_offset=target.offset)  # fmt: skip
            return list(outputs)
        targets = list(outputs or ()) or [
            self.context.empty(shape, info.dtype.numpy)
            for shape, info in zip(self.kernel.output_shapes, self.info.outputs)
        ]
        with self.kernel.lock:
            self.kernel.enqueue(queue, args, targets)
            if self.activation_kernel is not None:
                assert self.info.activation is not None  # what the activation kernel was made for
                # In place: a kernel's outputs never alias its inputs.
                enqueue_activation(
                    self.kernel, self.activation_kernel, queue, targets[0], targets[0], self.info.activation
                )
        return targets

    def record(
        self, queue: Any, inputs: Sequence[Any], outputs: Sequence[GpuTensor]
    ) -> tuple[list[GpuTensor], BoundLaunches | None]:
        """``enqueue`` into the planned ``outputs``, its launches recorded: the outputs, and
        the launches bound to kernels of their own for later runs in the same pool (None
        where they cannot stand for the layer: see ``launches``)."""
        if not launches_recorded():
            return self.enqueue(queue, inputs, outputs), None
        host_values = [i for i in self.kernel.host_inputs if i < len(inputs) and inputs[i] is not None]
        with recording() as record:
            if self.kernel.is_view:
                refuse("a view")
            if any(self.kernel.constant(i) is None for i in host_values):
                refuse("a value read on the host that is not a constant")
            results = self.enqueue(queue, inputs, outputs)
        return results, bind(record, current_scratch.get())

    def execute(self, inputs: Sequence[Any], outputs: Sequence[GpuTensor] | None = None) -> list[GpuTensor]:
        """Run the layer on the device's own queue; blocks until its commands are done."""
        results = self.enqueue(self.context.queue, inputs, outputs)
        self.context.queue.finish()
        return results

    def _argument(self, index: int, value: Any) -> Any:
        if value is None or index in self.kernel.host_inputs:
            return value
        if index in self.device_constants:
            return self.device_constants[index]
        if isinstance(value, GpuTensor):
            return value
        # A host array the caller did not upload (``execute`` from a test, say): a blocking copy.
        return self.context.upload(np.asarray(value))


class GpuWorkloadFactory:
    """Makes GpuAcc workloads on one device; their kernels take local sizes from ``tuner``
    (default: none tuned, nothing timed)."""

    def __init__(self, memory_manager: Any, context: DeviceContext, tuner: Tuner | None = None) -> None:
        self.memory_manager = memory_manager
        self.context = context
        self.tuner = tuner or Tuner()

    def create_workload(self, info: WorkloadInfo) -> GpuWorkload:
        kernel = load_all().get(info.kind)
        if kernel is None:
            raise BackendError(f"GpuAcc has no kernel for layer {info.layer_name!r} ({info.kind})")
        return GpuWorkload(kernel(info, self.context, self.tuner))
