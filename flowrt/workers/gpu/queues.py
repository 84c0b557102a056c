"""Queue actors: one OpenCL command queue per priority level, each served by a trio task.

An actor owns its ``cl.CommandQueue`` — made with ``CL_QUEUE_PRIORITY_KHR`` where the device
takes the property (NVIDIA does), plain where it does not (PoCL) — and serves its inbox in
arrival order: a submission is a function that enqueues commands on the queue (a whole GPU
segment of a run: uploads, kernels, downloads) and returns the last one's event, or None. The
actor enqueues and flushes, then moves on; the submitter is woken by the event's completion
callback (see ``completion``), so no thread waits per kernel and nothing polls.

Priorities reach the hardware where the driver takes the hint, but a hint only orders work
the device has not started: a GPU runs what is already queued to it before it looks at a
later high-priority queue (on an H100, five queued low-priority runs all finished before a
high-priority one submitted after them). So on every device the actors share an
:class:`Admission` that lets only a few submissions be on the device at once and admits the
waiting one of the highest priority first: work queued at a low level waits behind a later
high-priority run instead of filling the device ahead of it.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from typing import Any

import attrs
import trio

from flowrt.errors import BackendError, FlowrtError
from flowrt.types import Priority
from flowrt.workers.gpu.completion import CompletionWaiter, EventCompletion
from flowrt.workers.gpu.context import DeviceContext
from flowrt.workers.gpu.device import (
    CL_QUEUE_PRIORITY_HIGH_KHR,
    CL_QUEUE_PRIORITY_LOW_KHR,
    CL_QUEUE_PRIORITY_MED_KHR,
    cl,
    priority_properties,
)
from flowrt.workers.gpu.scratch import ScratchSet, current_scratch

PRIORITY_LEVELS = {
    Priority.HIGH: CL_QUEUE_PRIORITY_HIGH_KHR,
    Priority.MEDIUM: CL_QUEUE_PRIORITY_MED_KHR,
    Priority.LOW: CL_QUEUE_PRIORITY_LOW_KHR,
}

# Enqueues commands on the queue it is given and returns the event of the last one (or None).
Enqueue = Callable[[Any], Any]

# Submissions on the device at once: one running and one enqueued behind it, so the device
# does not idle while the next is being enqueued.
IN_FLIGHT = 2


class Admission:
    """How many submissions may be on a device at once, and who goes next: the waiting one of
    the highest priority (the lowest ``Priority`` value), first come first served within one.

    ``limit`` None admits everything at once (the driver orders the levels itself).
    """

    def __init__(self, limit: int | None) -> None:
        self.limit = limit
        self.in_flight = 0
        self._waiting: list[tuple[int, int, trio.Event]] = []
        self._sequence = itertools.count()

    @property
    def waiting(self) -> int:
        """Submissions held back, waiting for a place on the device."""
        return len(self._waiting)

    async def acquire(self, priority: Priority) -> None:
        if self.limit is None or (self.in_flight < self.limit and not self._waiting):
            self.in_flight += 1
            return
        entry = (int(priority), next(self._sequence), trio.Event())
        self._waiting.append(entry)
        try:
            await entry[2].wait()
        except BaseException:
            if entry in self._waiting:
                self._waiting.remove(entry)
            else:  # admitted just as we were cancelled: pass the slot on
                self.release()
            raise

    def release(self) -> None:
        if self._waiting:
            entry = min(self._waiting)
            self._waiting.remove(entry)
            entry[2].set()  # the slot passes to it: in_flight stays
        else:
            self.in_flight -= 1


@attrs.define(eq=False)
class _Submission:
    enqueue: Enqueue
    completion: EventCompletion
    enqueued: trio.Event = attrs.Factory(trio.Event)
    abandoned: bool = False
    error: Exception | None = None
    scratch: ScratchSet | None = None
    owner: Any = None  # whose scratch set the commands use (see ``ScratchSets.take``)


class QueueActor:
    """Owns one command queue at one priority level; ``submit`` from any trio task.

    ``run`` is the actor's task (start it in a nursery; ``open_queue_actors`` does). It
    stops when its ``send_channel`` is closed or it is cancelled.
    """

    def __init__(
        self, context: DeviceContext, priority: Priority, admission: Admission | None = None
    ) -> None:
        self.priority = Priority(priority)
        self.priority_hinted = context.priority_hints
        properties = priority_properties(PRIORITY_LEVELS[self.priority]) if self.priority_hinted else 0
        self.queue = cl.CommandQueue(
            context.context,
            context.device,
            properties=properties,  # type: ignore[arg-type]  # pyopencl's stubs lack property lists
        )
        self.admission = admission or Admission(None)
        self.scratch_sets = context.scratch_sets
        self.waiter = CompletionWaiter(f"flowrt-gpu-{self.priority.name.lower()}-completion")
        self.send_channel, self.receive_channel = trio.open_memory_channel[_Submission](math.inf)

    async def run(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        self.waiter.start()
        try:
            task_status.started()
            async with self.receive_channel:
                async for submission in self.receive_channel:
                    if submission.abandoned:
                        continue
                    await self.admission.acquire(self.priority)
                    if submission.abandoned:  # cancelled while waiting for the device
                        self.admission.release()
                        continue
                    self._serve(submission)
        finally:
            await self.waiter.stop()

    def _serve(self, submission: _Submission) -> None:
        # The kernels' temporaries come from a scratch set lent until the commands finish.
        submission.scratch = self.scratch_sets.take(submission.owner)
        lent = current_scratch.set(submission.scratch)
        try:
            event = submission.enqueue(self.queue)
        except Exception as e:  # reported to the submitter, which raises it
            submission.error = e
            event = None
        finally:
            current_scratch.reset(lent)
        try:
            # Whatever was enqueued before a failure must finish before the submitter goes on.
            if event is None:
                event = cl.enqueue_marker(self.queue)
            # Hand the commands to the device now: a callback fires only for submitted work.
            self.queue.flush()
            submission.completion.attach(event, self.waiter)
        except Exception as e:
            self.queue.finish()  # no event to wait on: make sure nothing is left running
            submission.error = submission.error or e
            submission.completion.fail()
        submission.enqueued.set()

    async def submit(self, enqueue: Enqueue, owner: Any = None) -> None:
        """Have the actor run ``enqueue(queue)``; return once the device has finished that work.
        Its kernels' temporaries are ``owner``'s scratch set when it has one free (see
        ``ScratchSets.take``).

        Cancelled before the actor reached it, the work is dropped. Once enqueued it cannot be
        recalled, so a cancelled caller still waits (shielded) for it to finish: the memory it
        reads and writes must not be released under a running kernel. An error ``enqueue``
        raises is raised here once the work enqueued before it has finished: a flowrt error
        as it is, any other as a BackendError.
        """
        submission = _Submission(enqueue, EventCompletion(), owner=owner)
        self.send_channel.send_nowait(submission)
        try:
            await submission.enqueued.wait()
        except trio.Cancelled:
            submission.abandoned = True
            if submission.enqueued.is_set():
                with trio.CancelScope(shield=True):
                    await self._finished(submission)
            raise
        with trio.CancelScope(shield=True):
            status = await self._finished(submission)
        if isinstance(submission.error, FlowrtError):
            raise submission.error
        if submission.error is not None:
            raise BackendError(
                f"enqueueing on the {self.priority.name} OpenCL queue failed: {submission.error}"
            ) from submission.error
        if status != cl.command_execution_status.COMPLETE:
            raise BackendError(
                f"an OpenCL command on the {self.priority.name} queue failed with status {status}"
            )

    async def _finished(self, submission: _Submission) -> int:
        """Wait for an enqueued submission's commands to finish; give its device slot and its
        scratch set back."""
        try:
            return await submission.completion.wait()
        finally:
            self.admission.release()
            if submission.scratch is not None:
                self.scratch_sets.give(submission.scratch)
                submission.scratch = None


class QueueActors:
    """A device's three queue actors, one per priority level; ``actors[Priority.HIGH]``.

    They share one :class:`Admission`: ``IN_FLIGHT`` submissions on the device at once (or
    ``in_flight_limit``), highest priority first.
    """

    def __init__(self, context: DeviceContext, in_flight_limit: int | None = None) -> None:
        limit = in_flight_limit or IN_FLIGHT
        self.admission = Admission(limit)
        self.by_priority = {p: QueueActor(context, p, self.admission) for p in PRIORITY_LEVELS}

    def __getitem__(self, priority: Priority | int) -> QueueActor:
        return self.by_priority[Priority(priority)]

    def __iter__(self) -> Iterator[QueueActor]:
        return iter(self.by_priority.values())


@asynccontextmanager
async def open_queue_actors(
    context: DeviceContext, in_flight_limit: int | None = None
) -> AsyncIterator[QueueActors]:
    """Start a device's queue actors in a nursery of their own; they stop when the block ends."""
    actors = QueueActors(context, in_flight_limit)
    async with trio.open_nursery() as nursery:
        for actor in actors:
            await nursery.start(actor.run)
        try:
            yield actors
        finally:
            for actor in actors:
                actor.send_channel.close()
