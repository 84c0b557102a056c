"""OpenCL event completion as something a trio task can await.

Each queue actor has a :class:`CompletionWaiter`: one long-lived thread that waits for its
submissions' events in the order they were enqueued (``clWaitForEvents``; an in-order queue
completes them in that order) and hands each completion to the trio run. This is the one
place GpuAcc uses ``trio.lowlevel``: ``TrioToken.run_sync_soon`` is trio's call for a thread
that must not wait for trio, whereas ``trio.from_thread.run_sync`` would hold the waiter
until trio got round to it (and the next completion behind it). So no thread waits per
kernel and nothing polls: one thread per queue, one wake-up per completion.

Driver callbacks (``clSetEventCallback``) are not used. NVIDIA's driver delivers them up to
20 ms after the command finished (measured on an H100: a kernel of 0.3 ms was reported after
16 ms) while ``clWaitForEvents`` returns at once; attaching one cost the enqueueing thread
tens of microseconds a submission, and each woke the trio run a second time; and one still
to come when the process exits calls into an interpreter that is shutting down, which made
NVIDIA's driver abort the process ("terminate called without an active exception", exit
status 134). ``clWaitForEvents`` also flushes the queue, so the waiter never waits for work
the device was not given.
"""

from __future__ import annotations

import queue
import threading
import time
from typing import Any

import trio


class EventCompletion:
    """Wakes the trio task that awaits ``wait()`` once an attached OpenCL event completes.

    Make it inside the trio run (it takes the run's token), then ``attach`` an event. The
    status ``wait()`` returns is OpenCL's: ``CL_COMPLETE`` (0), or a negative error code
    when the command was abandoned.
    """

    def __init__(self) -> None:
        self._token = trio.lowlevel.current_trio_token()
        self._done = trio.Event()
        self.status: int | None = None
        self.done_at: float | None = None  # when the waiter saw it complete (time.perf_counter)

    def attach(self, event: Any, waiter: CompletionWaiter) -> None:
        """Report ``event``'s completion through ``waiter`` (its queue's)."""
        waiter.inbox.put((event, self))

    def _on_complete(self, status: int) -> None:
        # In the waiter's thread: hand the wake-up to the trio loop and return at once.
        self.done_at = time.perf_counter()
        try:
            self._token.run_sync_soon(self._deliver, status)
        except trio.RunFinishedError:
            pass  # the run is over, so no task is waiting any more

    def fail(self, status: int = -1) -> None:
        """Complete without an event (nothing could be attached), with an error ``status``;
        from the trio thread."""
        self._deliver(status)

    def _deliver(self, status: int) -> None:
        if not self._done.is_set():  # fail() may have come first
            self.status = status
            self._done.set()

    async def wait(self) -> int:
        await self._done.wait()
        assert self.status is not None  # set before the event
        return self.status


class CompletionWaiter:
    """A thread that waits for attached events in the order they came (one queue's, which
    complete in that order) and reports each to its EventCompletion. ``start`` it, and
    ``stop`` it once nothing it waits for is pending; ``stop`` returns after the thread has
    ended."""

    def __init__(self, name: str) -> None:
        self.inbox: queue.SimpleQueue[tuple[Any, EventCompletion] | None] = queue.SimpleQueue()
        self.thread = threading.Thread(target=self._serve, name=name, daemon=True)

    def start(self) -> None:
        self.thread.start()

    async def stop(self) -> None:
        """End the thread once the events put before have completed."""
        self.inbox.put(None)
        with trio.CancelScope(shield=True):
            await trio.to_thread.run_sync(self.thread.join)

    def _serve(self) -> None:
        while (job := self.inbox.get()) is not None:
            event, completion = job
            try:
                event.wait()
            except Exception:  # a failed command: its status says how
                pass
            completion._on_complete(event.command_execution_status)
