"""A trio event loop in a thread of its own, for callers outside trio.

The one place flowrt crosses from foreign threads into trio: work is handed in with
``trio.from_thread`` against the loop's token. The loop's nursery owns every task it starts;
``close()`` cancels them and joins the thread.
"""

from __future__ import annotations

import threading
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import trio

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
            # The token is how other threads reach this loop (trio.from_thread needs it).
            self._token = trio.lowlevel.current_trio_token()
            self._ready.set()
            await trio.sleep_forever()

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def run(self, async_fn: Callable[..., Awaitable[T]], *args: Any) -> T:
        """Run ``async_fn(*args)`` in the loop and block the calling thread for its result."""
        return trio.from_thread.run(async_fn, *args, trio_token=self._token)

    def start_soon(self, async_fn: Callable[..., Awaitable[Any]], *args: Any) -> None:
        """Start ``async_fn(*args)`` as a task of the loop's nursery; returns at once."""
        trio.from_thread.run_sync(self._nursery.start_soon, async_fn, *args, trio_token=self._token)  # type: ignore[union-attr]

    def close(self) -> None:
        """Cancel every task of the loop and wait for the thread to end (idempotent)."""
        if self._thread.is_alive():
            try:
                trio.from_thread.run_sync(self._nursery.cancel_scope.cancel, trio_token=self._token)  # type: ignore[union-attr]
            except trio.RunFinishedError:
                pass
            self._thread.join()
