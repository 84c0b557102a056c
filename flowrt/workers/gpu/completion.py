"""OpenCL event completion as something a trio task can await.

This is the one place GpuAcc uses ``trio.lowlevel``, because there is no other way: an
OpenCL driver reports that a command finished by calling back from a thread of its own, and
that thread must not block (it may be the driver's only one). ``TrioToken.run_sync_soon`` is
trio's call for exactly this — safe from any thread, never blocking — whereas
``trio.from_thread.run_sync`` would hold the driver's thread until trio got round to it. So
no thread waits per kernel and nothing polls: the driver's callback schedules one wake-up.
"""

from __future__ import annotations

from typing import Any

import trio

from flowrt.workers.gpu.device import cl


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

    def attach(self, event: Any) -> None:
        event.set_callback(cl.command_execution_status.COMPLETE, self._on_complete)

    def _on_complete(self, status: int) -> None:
        # In a driver thread: hand the wake-up to the trio loop and return at once.
        try:
            self._token.run_sync_soon(self._deliver, status)
        except trio.RunFinishedError:
            pass  # the run is over, so no task is waiting any more

    def fail(self, status: int = -1) -> None:
        """Complete without an event (nothing could be attached), with an error ``status``;
        from the trio thread."""
        self._deliver(status)

    def _deliver(self, status: int) -> None:
        self.status = status
        self._done.set()

    async def wait(self) -> int:
        await self._done.wait()
        return self.status  # type: ignore[return-value]
