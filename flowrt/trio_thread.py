"""A trio event loop in a thread of its own, for callers outside trio.

The one place flowrt crosses from foreign threads into trio: work is handed in through the
loop's token with ``run_sync_soon`` (not ``trio.from_thread``, which refuses callers that are
themselves in a trio loop). The loop's nursery owns every task it starts;
``close()`` cancels them and joins the thread.
"""

from __future__ import annotations

import concurrent.futures
import threading
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import trio

from flowrt.errors import FlowrtError

T = TypeVar("T")


class TrioThread:
    """Runs a trio loop in a daemon thread until ``close()``."""

    def __init__(self, name: str = "flowrt-runtime") -> None:
        self._ready = threading.Event()
        self._token: trio.lowlevel.TrioToken | None = None
        self._nursery: trio.Nursery | None = None
        self._thread = threading.Thread(target=trio.run, args=(self._main,), name=name, daemon=True)
        self._thread.start()
        self._ready.wait()

    async def _main(self) -> None:
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            # The token is how other threads reach this loop (run_sync_soon needs it).
            self._token = trio.lowlevel.current_trio_token()
            self._ready.set()
            await trio.sleep_forever()

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def run(self, async_fn: Callable[..., Awaitable[T]], *args: Any) -> T:
        """Run ``async_fn(*args)`` in the loop and block the calling thread for its result.

        Works from any thread but the loop's own, a thread running another trio loop included
        (``trio.from_thread.run`` refuses those); it raises FlowrtError if the loop closes first.
        """
        future: concurrent.futures.Future = concurrent.futures.Future()

        async def runner() -> None:
            try:
                future.set_result(await async_fn(*args))
            except trio.Cancelled:
                future.set_exception(FlowrtError("the runtime thread was closed while the call ran"))
                raise
            except BaseException as e:
                future.set_exception(e)

        try:
            self._token.run_sync_soon(self._nursery.start_soon, runner)  # type: ignore[union-attr]
        except trio.RunFinishedError:
            raise FlowrtError("the runtime thread is closed") from None
        return future.result()

    def start(self, async_fn: Callable[..., Awaitable[Any]], *args: Any) -> Any:
        """Start ``async_fn(*args, task_status=...)`` as a task of the loop's nursery (``Nursery.start``)
        and block until it reports started; returns the value it passed to ``started``."""
        return self.run(self._nursery.start, async_fn, *args)  # type: ignore[union-attr]

    def start_soon(self, async_fn: Callable[..., Awaitable[Any]], *args: Any) -> None:
        """Start ``async_fn(*args)`` as a task of the loop's nursery; returns at once."""
        try:
            self._token.run_sync_soon(self._nursery.start_soon, async_fn, *args)  # type: ignore[union-attr]
        except trio.RunFinishedError:
            raise FlowrtError("the runtime thread is closed") from None

    def close(self) -> None:
        """Cancel every task of the loop and wait for the thread to end (idempotent)."""
        if self._thread.is_alive():
            try:
                self._token.run_sync_soon(self._nursery.cancel_scope.cancel)  # type: ignore[union-attr]
            except trio.RunFinishedError:
                pass
            self._thread.join()
