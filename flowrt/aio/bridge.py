"""A runtime entered under asyncio: it runs in a trio loop of its own thread
(``flowrt.trio_thread.TrioThread``), and each public async call awaits, in the caller's asyncio
task, a task of that loop that makes the call there.

Cancellation crosses both ways. An asyncio task cancelled while it awaits a call
(``task.cancel()``, ``asyncio.timeout``) cancels the call's trio task and waits for it to end —
a run stops at its next workload and gives its memory pool back — before its CancelledError goes
on. An async function that a pipeline stage calls from the trio side runs as a task of the
caller's asyncio loop and is cancelled when its trio caller is.

Each call crosses threads twice (into the trio thread and back). The trio path never comes
here: a runtime entered under trio is the engine itself.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import functools
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, TypeVar

import sniffio
import trio

from flowrt.errors import FlowrtError
from flowrt.trio_thread import TrioCall, TrioThread

if TYPE_CHECKING:
    import asyncio

# asyncio is imported in the functions that use it, all called under an asyncio loop (which
# has imported it): a process under trio does not pay its import (~25 ms of a start).

T = TypeVar("T")


def async_library() -> str:
    """The async library of the calling task: "trio", "asyncio", ...; "" outside any."""
    try:
        return sniffio.current_async_library()
    except sniffio.AsyncLibraryNotFoundError:
        return ""


def _retrieved(waiter: asyncio.Future) -> asyncio.Future:
    """``waiter``, its error marked as retrieved once it ends: a task cancelled while waiting
    for it drops its outcome on purpose, and asyncio would log it as never retrieved."""
    waiter.add_done_callback(lambda w: w.cancelled() or w.exception())
    return waiter


async def _settle(waiter: asyncio.Future) -> None:
    """Wait until ``waiter`` is done, however often this task is cancelled meanwhile (the
    caller raises its own CancelledError next); its outcome is dropped."""
    import asyncio

    while not waiter.done():
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.wait([waiter])


async def _to_the_end(waiter: asyncio.Future) -> Any:
    """``await waiter``; cancelled meanwhile, wait for it all the same, then raise."""
    import asyncio

    try:
        return await asyncio.shield(_retrieved(waiter))
    except asyncio.CancelledError:
        await _settle(waiter)
        raise


async def _call_sync(fn: Callable[..., T], *args: Any) -> T:
    return fn(*args)


async def _coroutine(awaitable: Awaitable[T]) -> T:
    return await awaitable


class AsyncioBridge:
    """A runtime's trio thread, seen from the asyncio loop that entered the runtime."""

    def __init__(self, thread: TrioThread, loop: asyncio.AbstractEventLoop) -> None:
        self.thread = thread
        self.loop = loop

    @classmethod
    async def start(cls, runtime: Any, what: str = "Runtime") -> AsyncioBridge:
        """Enter ``runtime`` (its trio ``__aenter__``) in a new trio thread; ``what`` names it
        in errors ("this Runtime is closed"). FlowrtError under an async library other than
        asyncio; the runtime's own errors as they are."""
        import asyncio

        library = async_library()
        if library != "asyncio":
            raise FlowrtError(f"flowrt runs under trio or asyncio; this task runs under {library!r}")
        loop = asyncio.get_running_loop()
        # Started from an executor thread: entering a runtime starts its CPU workers' threads,
        # which must not block the asyncio loop.
        make = functools.partial(TrioThread, name="flowrt-runtime", resource=runtime, what=what)
        starting = _retrieved(loop.run_in_executor(None, make))
        try:
            thread = await asyncio.shield(starting)
        except asyncio.CancelledError:
            await _settle(starting)
            if not starting.cancelled() and starting.exception() is None:
                await _settle(_retrieved(loop.run_in_executor(None, starting.result().close)))
            raise
        return cls(thread, loop)

    async def close(self) -> None:
        """Close the runtime: calls still running end with FlowrtError, the runtime's exit runs
        in its trio thread (as under trio) and the thread ends. Cancelled meanwhile, it still
        finishes, then raises the CancelledError."""
        await _to_the_end(self.loop.run_in_executor(None, self.thread.close))
        if self.thread.error is not None:
            raise self.thread.error

    async def call(self, async_fn: Callable[..., Awaitable[T]], *args: Any) -> T:
        """``await async_fn(*args)`` in the trio thread: its result, or its error as it was
        raised there. Cancelled, the call is cancelled and waited for (see the module doc)."""
        call = self.thread.call_soon(async_fn, *args)
        return await self.wait(call.future, call)

    async def wait(self, future: concurrent.futures.Future, call: TrioCall) -> Any:
        """Await ``future``, which the trio-side ``call`` settles; cancelled meanwhile, cancel
        ``call`` and wait for its end before the CancelledError goes on."""
        import asyncio

        try:
            return await asyncio.shield(_retrieved(asyncio.wrap_future(future)))
        except asyncio.CancelledError:
            call.cancel()
            await _settle(_retrieved(asyncio.wrap_future(call.future)))
            raise

    def call_nowait(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` in the trio thread, blocking the asyncio loop until it returns: for
        the sync methods that must answer at once (``send_nowait``); keep ``fn`` quick."""
        return self.thread.run(_call_sync, fn, *args)

    async def in_caller_loop(self, awaitable: Awaitable[T]) -> T:
        """From the trio side: ``await awaitable`` as a task of the caller's asyncio loop (a
        pipeline's async function stage). Cancelled, it cancels that task and waits for it."""
        import asyncio

        future = asyncio.run_coroutine_threadsafe(_coroutine(awaitable), self.loop)
        done = trio.Event()
        future.add_done_callback(lambda _: self.thread.run_sync_soon(done.set))
        try:
            await done.wait()
        except trio.Cancelled:
            future.cancel()
            with trio.CancelScope(shield=True):
                await done.wait()
            raise
        return future.result()
