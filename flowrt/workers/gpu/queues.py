"""Queue actors: one OpenCL command queue per priority level, each served by a trio task.

An actor owns its ``cl.CommandQueue`` — made with ``CL_QUEUE_PRIORITY_KHR`` where the device
takes the property (NVIDIA does), plain where it does not (PoCL) — and serves its inbox in
arrival order: a submission is a function that enqueues commands on the queue and returns the
last one's event. The actor enqueues and flushes, then moves on; the submitter is woken by the
event's completion callback (see ``completion``), so no thread waits per kernel and nothing
polls. Priorities therefore reach the hardware where the driver allows, and everywhere keep
high-priority work out of the queue that low-priority work fills.
"""

from __future__ import annotations

import math
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from typing import Any

import attrs
import trio

from flowrt.errors import BackendError
from flowrt.types import Priority
from flowrt.workers.gpu.completion import EventCompletion
from flowrt.workers.gpu.context import DeviceContext
from flowrt.workers.gpu.device import (
    CL_QUEUE_PRIORITY_HIGH_KHR,
    CL_QUEUE_PRIORITY_LOW_KHR,
    CL_QUEUE_PRIORITY_MED_KHR,
    cl,
    priority_properties,
)

PRIORITY_LEVELS = {
    Priority.HIGH: CL_QUEUE_PRIORITY_HIGH_KHR,
    Priority.MEDIUM: CL_QUEUE_PRIORITY_MED_KHR,
    Priority.LOW: CL_QUEUE_PRIORITY_LOW_KHR,
}

# Enqueues commands on the queue it is given and returns the event of the last one.
Enqueue = Callable[[Any], Any]


@attrs.define(eq=False)
class _Submission:
    enqueue: Enqueue
    completion: EventCompletion
    enqueued: trio.Event = attrs.Factory(trio.Event)
    abandoned: bool = False
    error: Exception | None = None


class QueueActor:
    """Owns one command queue at one priority level; ``submit`` from any trio task.

    ``run`` is the actor's task (start it in a nursery; ``open_queue_actors`` does). It
    stops when its ``send_channel`` is closed or it is cancelled.
    """

    def __init__(self, context: DeviceContext, priority: Priority) -> None:
        self.priority = Priority(priority)
        self.priority_hinted = context.priority_hints
        properties = priority_properties(PRIORITY_LEVELS[self.priority]) if self.priority_hinted else 0
        self.queue = cl.CommandQueue(context.context, context.device, properties=properties)
        self.send_channel, self.receive_channel = trio.open_memory_channel[_Submission](math.inf)

    async def run(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        async with self.receive_channel:
            async for submission in self.receive_channel:
                self._serve(submission)

    def _serve(self, submission: _Submission) -> None:
        if submission.abandoned:
            return
        try:
            event = submission.enqueue(self.queue)
            # Hand the commands to the device now: a callback fires only for submitted work.
            self.queue.flush()
            submission.completion.attach(event)
        except Exception as e:  # reported to the submitter, which raises it
            submission.error = e
        submission.enqueued.set()

    async def submit(self, enqueue: Enqueue) -> None:
        """Have the actor run ``enqueue(queue)``; return once the device has finished that work.

        Cancelled before the actor reached it, the work is dropped. Once enqueued it cannot be
        recalled, so a cancelled caller still waits (shielded) for it to finish: the memory it
        reads and writes must not be released under a running kernel.
        """
        submission = _Submission(enqueue, EventCompletion())
        self.send_channel.send_nowait(submission)
        try:
            await submission.enqueued.wait()
        except trio.Cancelled:
            submission.abandoned = True
            if submission.enqueued.is_set() and submission.error is None:
                with trio.CancelScope(shield=True):
                    await submission.completion.wait()
            raise
        if submission.error is not None:
            raise BackendError(
                f"enqueueing on the {self.priority.name} OpenCL queue failed: {submission.error}"
            ) from submission.error
        with trio.CancelScope(shield=True):
            status = await submission.completion.wait()
        if status != cl.command_execution_status.COMPLETE:
            raise BackendError(
                f"an OpenCL command on the {self.priority.name} queue failed with status {status}"
            )


class QueueActors:
    """A device's three queue actors, one per priority level; ``actors[Priority.HIGH]``."""

    def __init__(self, context: DeviceContext) -> None:
        self.by_priority = {p: QueueActor(context, p) for p in PRIORITY_LEVELS}

    def __getitem__(self, priority: Priority | int) -> QueueActor:
        return self.by_priority[Priority(priority)]

    def __iter__(self) -> Iterator[QueueActor]:
        return iter(self.by_priority.values())


@asynccontextmanager
async def open_queue_actors(context: DeviceContext) -> AsyncIterator[QueueActors]:
    """Start a device's queue actors in a nursery of their own; they stop when the block ends."""
    actors = QueueActors(context)
    async with trio.open_nursery() as nursery:
        for actor in actors:
            await nursery.start(actor.run)
        try:
            yield actors
        finally:
            for actor in actors:
                actor.send_channel.close()
