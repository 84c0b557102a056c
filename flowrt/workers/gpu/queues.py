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

Admission counts *chunks*. A submission may enqueue its commands through a generator that
yields after each one, or after each few, yielding how many (a run's device segment does:
recorded launches go as many at a time as ``launches.current_room`` says the chunk takes); below HIGH priority the actor cuts it
into chunks of about ``CHUNK_S`` of device time, each admitted on its own and giving its
place back when it completes, so a HIGH run that arrives is not queued behind whole runs;
and a HIGH submission may take one place beyond the limit, so it goes to the device at once,
beside the chunks there (NVIDIA runs its queues side by side). A cut costs the device a
pause (the next chunk is enqueued once the one before has been reported done), so
submissions are cut only while there is someone to make way for: a submission of a higher
priority arrived in the last ``RECENT_S``. The
device time per command is measured on the submissions the actors serve: a chunk's time
runs from its first command, or from the end of the chunk before it if that ended later
(the device was busy with it), to its end; until one of an owner's submissions has been
timed, its submissions are not cut.
"""

from __future__ import annotations

import inspect
import itertools
import math
import time
import weakref
from collections.abc import AsyncIterator, Callable, Generator, Iterator
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
from flowrt.workers.gpu.launches import Room, current_room
from flowrt.workers.gpu.scratch import ScratchSet, current_scratch

PRIORITY_LEVELS = {
    Priority.HIGH: CL_QUEUE_PRIORITY_HIGH_KHR,
    Priority.MEDIUM: CL_QUEUE_PRIORITY_MED_KHR,
    Priority.LOW: CL_QUEUE_PRIORITY_LOW_KHR,
}

# Enqueues commands on the queue it is given and returns the event of the last one (or None),
# or a generator that yields after each command it enqueues and returns that event.
Enqueue = Callable[[Any], Any]

# Chunks on the device at once: one running and one enqueued behind it, so the device does
# not idle while the next is being enqueued.
IN_FLIGHT = 2
# The device time of a chunk of a cut submission: what a higher-priority run arriving waits
# for, per chunk on the device, beyond its own time. Each cut pauses the device briefly
# (resnet50 at batch 8 on an H100: 0.5 ms chunks cost the run 20%, 1 ms ones nothing).
CHUNK_S = 1e-3
# How fast the estimate of the device time per command may grow, per submission timed.
PACE_RISE = 0.1
# How long after a submission of a higher priority arrived the lower ones are still cut.
RECENT_S = 1.0


class Admission:
    """How many submissions (or chunks of them) may be on a device at once, and who goes
    next: the waiting one of the highest priority (the lowest ``Priority`` value), first come
    first served within one.

    A HIGH submission may take one place beyond ``limit``: it goes to the device beside the
    chunks on it (NVIDIA's queues run side by side) instead of waiting for one of them to
    end. ``limit`` None admits everything at once (the driver orders the levels itself).
    """

    def __init__(self, limit: int | None) -> None:
        self.limit = limit
        self.in_flight = 0
        self._waiting: list[tuple[int, int, trio.Event]] = []
        self._sequence = itertools.count()
        # Device seconds per command of each owner's submissions (a run's memory pool: one
        # model's), measured on those served.
        self._pace: weakref.WeakKeyDictionary[Any, float] = weakref.WeakKeyDictionary()
        # When a submission of each priority last asked for a place (trio's clock).
        self._arrived: dict[int, float] = {}

    def commands_per_chunk(self, priority: Priority, owner: Any) -> int | None:
        """How many commands of ``owner``'s submission at ``priority`` go to the device as one
        chunk; None: the whole submission (no limit, nothing of a higher priority arrived in
        the last ``RECENT_S``, or not yet timed)."""
        pace = self._pace.get(owner) if owner is not None else None
        if self.limit is None or not pace or not self._outranked(priority):
            return None
        return max(1, round(CHUNK_S / pace))

    def _outranked(self, priority: int) -> bool:
        """Whether a submission of a higher priority than ``priority`` arrived lately."""
        since = trio.current_time() - RECENT_S
        return any(at >= since for level, at in self._arrived.items() if level < priority)

    def _room(self, priority: int) -> bool:
        """Whether a submission at ``priority`` may go on the device now."""
        assert self.limit is not None
        return self.in_flight < self.limit + (priority == Priority.HIGH)

    def timed(self, owner: Any, seconds: float, commands: int) -> None:
        """``owner``'s submission of ``commands`` kept the device ``seconds``. Waiting behind
        other work only lengthens that, so the estimate falls to a faster measurement at once
        and rises by ``PACE_RISE`` a submission at most."""
        if owner is None or commands <= 0 or seconds <= 0:
            return
        pace, old = seconds / commands, self._pace.get(owner)
        self._pace[owner] = pace if old is None else min(pace, old * (1 + PACE_RISE))

    @property
    def waiting(self) -> int:
        """Submissions held back, waiting for a place on the device."""
        return len(self._waiting)

    async def acquire(self, priority: Priority) -> None:
        level = int(priority)
        self._arrived[level] = trio.current_time()
        # Straight on where there is room, unless one of its priority or higher waits first.
        if self.limit is None or (self._room(level) and not any(e[0] <= level for e in self._waiting)):
            self.in_flight += 1
            return
        entry = (level, next(self._sequence), trio.Event())
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
        self.in_flight -= 1
        # The waiting ones in turn while there is room for them (a lower one has no more).
        while self._waiting:
            entry = min(self._waiting)
            if not self._room(entry[0]):
                break
            self._waiting.remove(entry)
            self.in_flight += 1
            entry[2].set()


@attrs.define(eq=False)
class _Submission:
    enqueue: Enqueue
    completion: EventCompletion
    enqueued: trio.Event = attrs.Factory(trio.Event)
    abandoned: bool = False
    started: bool = False  # a chunk of it is on the device: it must finish before memory goes
    admitted: bool = True  # it holds a place on the device until its last commands complete
    error: Exception | None = None
    failed_status: int | None = None  # an earlier chunk's, when it did not complete
    scratch: ScratchSet | None = None
    owner: Any = None  # whose scratch set the commands use (see ``ScratchSets.take``)
    commands: int = 0
    # Each chunk's first command's time (``time.perf_counter``) and completion, in order.
    chunks: list[tuple[float, EventCompletion]] = attrs.Factory(list)
    chunk_started_at: float | None = None

    def device_seconds(self) -> float:
        """How long its chunks kept the device, from their completions' times."""
        total, previous_end = 0.0, None
        for started, completion in self.chunks:
            if completion.done_at is None:
                return 0.0
            start = started if previous_end is None else max(started, previous_end)
            total += completion.done_at - start
            previous_end = completion.done_at
        return total


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
            async with trio.open_nursery() as self._chunks:  # each waits for a chunk's end
                task_status.started()
                async with self.receive_channel:
                    async for submission in self.receive_channel:
                        if submission.abandoned:
                            continue
                        await self.admission.acquire(self.priority)
                        if submission.abandoned:  # cancelled while waiting for the device
                            self.admission.release()
                            continue
                        await self._serve(submission)
        finally:
            await self.waiter.stop()

    async def _serve(self, submission: _Submission) -> None:
        # The kernels' temporaries come from a scratch set lent until the commands finish.
        submission.scratch = self.scratch_sets.take(submission.owner)
        lent = current_scratch.set(submission.scratch)
        try:
            event = submission.enqueue(self.queue)
            if inspect.isgenerator(event):
                event = await self._enqueue_chunks(submission, event)
        except Exception as e:  # reported to the submitter, which raises it
            submission.error = e
            event = None
        finally:
            current_scratch.reset(lent)
        self._finish(submission, event)

    async def _enqueue_chunks(self, submission: _Submission, commands: Generator[Any, Any, Any]) -> Any:
        """Run a submission's generator of commands to its end and return its last event,
        cutting it into chunks (``Admission.commands_per_chunk``): at each cut, the chunk
        goes to the device and this waits for a place for the next one. A submission
        abandoned meanwhile stops at the next cut."""
        room = Room()  # what is left of the chunk, for a generator that enqueues many at once
        token = current_room.set(room)
        try:
            return await self._enqueue_chunks_in(submission, commands, room)
        finally:
            current_room.reset(token)

    async def _enqueue_chunks_in(
        self, submission: _Submission, commands: Generator[Any, Any, Any], room: Room
    ) -> Any:
        per_chunk = self.admission.commands_per_chunk(self.priority, submission.owner)
        count = 0
        while True:
            if count == 0:
                submission.chunk_started_at = time.perf_counter()
            room.commands = None if per_chunk is None else per_chunk - count
            try:
                enqueued = next(commands) or 1
            except StopIteration as end:
                return end.value
            submission.commands += enqueued
            count += enqueued
            if per_chunk is None or count < per_chunk:
                continue
            count = 0
            self._cut(submission)
            try:
                await self.admission.acquire(self.priority)
            except BaseException:  # cancelled: the actor stops; what is on the device ends
                submission.error = submission.error or FlowrtError("the queue actor stopped")
                commands.close()
                self._finish(submission, None, admitted=False)
                raise
            if submission.abandoned:
                commands.close()
                return None

    def _cut(self, submission: _Submission) -> None:
        """Send the commands enqueued so far to the device as one chunk, which gives its
        place back when it completes."""
        marker = cl.enqueue_marker(self.queue)
        self.queue.flush()
        completion = EventCompletion()
        completion.attach(marker, self.waiter)
        submission.started = True
        self._note_chunk(submission, completion)
        self._chunks.start_soon(self._chunk_done, submission, completion)

    @staticmethod
    def _note_chunk(submission: _Submission, completion: EventCompletion) -> None:
        if submission.chunk_started_at is not None:
            submission.chunks.append((submission.chunk_started_at, completion))
            submission.chunk_started_at = None

    async def _chunk_done(self, submission: _Submission, completion: EventCompletion) -> None:
        status = await completion.wait()
        self.admission.release()
        if status != cl.command_execution_status.COMPLETE and submission.failed_status is None:
            submission.failed_status = status

    def _finish(self, submission: _Submission, event: Any, admitted: bool = True) -> None:
        """Send the last of a submission's commands to the device and have the submitter
        woken when they complete. ``admitted``: whether they hold a place on the device."""
        submission.admitted = admitted
        try:
            # Whatever was enqueued before a failure must finish before the submitter goes on.
            if event is None:
                event = cl.enqueue_marker(self.queue)
            # Hand the commands to the device now: a callback fires only for submitted work.
            self.queue.flush()
            submission.completion.attach(event, self.waiter)
            self._note_chunk(submission, submission.completion)
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
            if submission.started or submission.enqueued.is_set():
                with trio.CancelScope(shield=True):
                    await submission.enqueued.wait()  # the actor stops at its next cut
                    await self._finished(submission)
            raise
        with trio.CancelScope(shield=True):
            status = await self._finished(submission)
        if status == cl.command_execution_status.COMPLETE and submission.failed_status is not None:
            status = submission.failed_status
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
            status = await submission.completion.wait()
            self.admission.timed(submission.owner, submission.device_seconds(), submission.commands)
            return status
        finally:
            if submission.admitted:
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
