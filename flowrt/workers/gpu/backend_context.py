"""GpuAcc's backend context: what one Runtime holds of GpuAcc — its device and queue actors.

Arm NN's ClBackendContext, on trio: the runtime makes it from its options
(``Runtime(opencl_device=...)``), starts ``run`` in its nursery (the queue actors, one per
priority level), and the executor hands it each GPU segment of a run as one submission.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import trio

from flowrt.engine.scheduler.device_array import DeviceArray
from flowrt.errors import FlowrtError
from flowrt.types import Priority
from flowrt.workers.gpu.context import DeviceContext
from flowrt.workers.gpu.device import cl
from flowrt.workers.gpu.launches import LAUNCHED
from flowrt.workers.gpu.queues import Enqueue, QueueActors, open_queue_actors
from flowrt.workers.gpu.tensor import GpuTensor


class GpuBackendContext:
    """A device's queue actors for one runtime, and the transfers the executor asks for.

    ``submit``, ``upload`` and ``download`` are the executor's device-runner protocol:
    ``submit(priority, enqueue, owner)`` runs ``enqueue(queue)`` on the queue actor of that
    priority and returns once the device has finished (the kernels' temporaries are
    ``owner``'s, a run's memory pool); ``upload``/``download`` enqueue a copy on the
    queue they are given and return the copy and its event (keep it until the work is done);
    ``launched()`` counts the kernel launches enqueued (a profiled run's records take each
    workload's).
    """

    def __init__(self, device: DeviceContext, in_flight_limit: int | None = None) -> None:
        self.device = device
        self.in_flight_limit = in_flight_limit
        self.actors: QueueActors | None = None
        self._closed = trio.Event()

    async def run(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        """The context's task: serve the queue actors until ``close``."""
        async with open_queue_actors(self.device, self.in_flight_limit) as actors:
            self.actors = actors
            task_status.started()
            await self._closed.wait()
        self.actors = None

    def close(self) -> None:
        """Stop the queue actors (work already submitted finishes first)."""
        self._closed.set()

    async def submit(self, priority: Priority | int, enqueue: Enqueue, owner: Any = None) -> None:
        if self.actors is None:
            raise FlowrtError(
                "GpuAcc's queue actors are not running: run a model inside the 'async with "
                "Runtime()' block that loaded it"
            )
        await self.actors[priority].submit(enqueue, owner)

    @staticmethod
    def launched() -> int:
        """Kernel launches enqueued so far (all of the process's GpuAcc queues)."""
        return LAUNCHED[0]

    def upload(self, queue: Any, array: np.ndarray) -> tuple[GpuTensor, Any]:
        return self.device.enqueue_upload(queue, array)

    def download(self, queue: Any, tensor: GpuTensor) -> tuple[np.ndarray, Any]:
        return self.device.enqueue_download(queue, tensor)

    def download_into(self, queue: Any, tensor: GpuTensor, array: np.ndarray) -> Any:
        return self.device.enqueue_download(queue, tensor, into=array)[1]

    def device_array(self, array: np.ndarray) -> DeviceArray:
        """A copy of ``array`` in the device's memory, as a run would upload it as a feed
        (float16 stays half, other types go as float32), standing for ``array``'s dtype;
        blocks until the copy is done."""
        return DeviceArray(self.device.upload(array), self.device, array.dtype)

    def holds(self, value: DeviceArray) -> bool:
        """Whether ``value`` lies in this context's device memory."""
        return value.owner is self.device

    def copy_out(self, queue: Any, tensor: GpuTensor) -> tuple[DeviceArray, Any]:
        """A copy of ``tensor`` into new device memory, enqueued on ``queue`` (the DeviceArray
        holds it once the returned event has completed)."""
        out = self.device.empty(tensor.shape, tensor.dtype)
        if not tensor.size:
            return DeviceArray(out, self.device), None
        event = cl.enqueue_copy(
            queue, out.buffer, tensor.buffer, byte_count=tensor.nbytes, src_offset=tensor.offset, dst_offset=0
        )
        return DeviceArray(out, self.device), event

    def pinned_array(self, shape: tuple[int, ...], dtype: Any) -> np.ndarray:
        """A new array of the device's page-locked host memory (``DeviceContext.pinned_array``)."""
        return self.device.pinned_array(shape, dtype)
