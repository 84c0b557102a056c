"""OpenCL event completion as something a trio task can await.

This is the one place GpuAcc uses ``trio.lowlevel``, because there is no other way: an
OpenCL driver reports that a command finished by calling back from a thread of its own, and
that thread must not block (it may be the driver's only one). ``TrioToken.run_sync_soon`` is
trio's call for exactly this — safe from any thread, never blocking — whereas
``trio.from_thread.run_sync`` would hold the driver's thread until trio got round to it. So
no thread waits per kernel and nothing polls: the driver's callback schedules one wake-up.

A callback can come late, though: NVIDIA's driver delivers callbacks for commands still
running when they were attached up to 20 ms after the commands finish (measured on an H100:
a kernel of 0.3 ms was reported after 16 ms), while ``clWaitForEvents`` returns at once. So
each queue actor also has a :class:`CompletionWaiter`, one long-lived thread that waits for
its submissions' last events in order; whichever of the two reports first wakes the task.

A callback still to come when the process exits is called into an interpreter that is
shutting down, and NVIDIA's driver then aborts the process ("terminate called without an
active exception", exit status 134, in about one exit in four once runs were fast). So the
callbacks not yet delivered are counted (:data:`PENDING`), and a waiter's ``stop`` (when a
runtime closes) waits for them, a second at most.
"""

from __future__ import annotations

import queue
import threading
import time
from typing import Any

import trio

from flowrt.workers.gpu.device import cl


class PendingCallbacks:
    """How many driver callbacks were attached and have not run yet, process-wide."""

    def __init__(self) -> None:
        self.count = 0
        self._lock = threading.Lock()
        self._none = threading.Event()
        self._none.set()

    def add(self) -> None:
        with self._lock:
            self.count += 1
            self._none.clear()

    def done(self) -> None:
        with self._lock:
            self.count -= 1
            if self.count == 0:
                self._none.set()

    def wait(self, timeout: float) -> bool:
        """Block until none is pending (True), or ``timeout`` seconds (False)."""
        return self._none.wait(timeout)


PENDING = PendingCallbacks()
# The longest a closing runtime waits for callbacks still to come (they come <= 20 ms late).
CALLBACK_GRACE_S = 1.0


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
        self.done_at: float | None = None  # when first reported complete (time.perf_counter)

    def attach(self, event: Any, waiter: CompletionWaiter | None = None) -> None:
        """Report ``event``'s completion by its callback, and by ``waiter`` when given."""
        PENDING.add()
        try:
            event.set_callback(cl.command_execution_status.COMPLETE, self._on_callback)
        except BaseException:
            PENDING.done()
            raise
        if waiter is not None:
            waiter.inbox.put((event, self))

    def _on_callback(self, status: int) -> None:
        # The driver's callback (the waiter calls _on_complete itself).
        try:
            self._on_complete(status)
        finally:
            PENDING.done()

    def _on_complete(self, status: int) -> None:
        # In a driver thread: hand the wake-up to the trio loop and return at once.
        if self.done_at is None:  # the callback and the waiter: either time will do
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
        if not self._done.is_set():  # the callback and the waiter both report
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
        """End the thread, then let the driver's callbacks still to come arrive (see the
        module doc)."""
        self.inbox.put(None)
        with trio.CancelScope(shield=True):
            await trio.to_thread.run_sync(self.thread.join)
            await trio.to_thread.run_sync(PENDING.wait, CALLBACK_GRACE_S)

    def _serve(self) -> None:
        while (job := self.inbox.get()) is not None:
            event, completion = job
            try:
                event.wait()
            except Exception:  # a failed command: its status says how
                pass
            completion._on_complete(event.command_execution_status)
