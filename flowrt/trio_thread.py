"""A trio event loop in a thread of its own, for callers outside trio.

The one place flowrt crosses between foreign threads and such a loop. Work is handed in through
the loop's token with ``run_sync_soon`` (not ``trio.from_thread``, which refuses callers that are
themselves in a trio loop); user code the loop calls back goes out to worker threads through
``call_in_thread``, so a callback may block on the loop (``run``) without blocking it. A
caller that must not block (an asyncio task, see ``flowrt.aio``) starts a call with
``call_soon`` and awaits its future.

Shutdown is ordered: the loop owns one *resource* (an async context manager, a ``Runtime``),
entered before any task starts and exited after every task has ended. ``close()`` cancels the
tasks, so the resource's exit itself is never cancelled half-way.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import logging
import threading
from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from typing import Any, TypeVar

import trio

from flowrt.errors import FlowrtError

T = TypeVar("T")

logger = logging.getLogger(__name__)

# The loop a thread belongs to: set in the loop's own thread and, while a callback runs, in
# the worker thread that runs it. Those threads must never wait for the loop to end.
_owner = threading.local()


class TrioCall:
    """One call running as a task of a ``TrioThread``'s loop (see ``TrioThread.call_soon``).

    ``future`` is settled by the loop only (its own ``cancel()`` does nothing: the future is
    running from the start); ``cancel()``, from any thread, cancels the call's task, which
    then settles the future with FlowrtError.
    """

    def __init__(self, thread: TrioThread) -> None:
        self.future: concurrent.futures.Future = concurrent.futures.Future()
        self.future.set_running_or_notify_cancel()
        self.scope = trio.CancelScope()
        self._thread = thread

    def cancel(self) -> None:
        """Cancel the call (at its next checkpoint; nothing if it has ended)."""
        self._thread.run_sync_soon(self.scope.cancel)


class TrioThread:
    """Runs a trio loop in a daemon thread until ``close()``.

    ``resource`` lives as long as the loop (its ``__aenter__`` value is ``self.value``); an
    error entering it is raised here. ``what`` names the owner in error messages.
    """

    def __init__(
        self,
        name: str = "flowrt-runtime",
        resource: AbstractAsyncContextManager | None = None,
        what: str = "runtime thread",
    ) -> None:
        self.what = what
        self.value: Any = None
        self._resource = resource if resource is not None else contextlib.nullcontext()
        self._lock = threading.Lock()
        self._closing = False  # no new work is accepted
        self._token: trio.lowlevel.TrioToken | None = None
        self._nursery: trio.Nursery | None = None
        self._waiting: set[concurrent.futures.Future] = set()  # calls not yet settled
        self._ready = threading.Event()
        self._start_error: BaseException | None = None
        self.error: BaseException | None = None  # what ended the loop after it started, if anything
        self._callback_limiter: trio.CapacityLimiter | None = None
        self._thread = threading.Thread(target=self._thread_main, name=name, daemon=True)
        self._thread.start()
        try:
            self._ready.wait()
        except BaseException:  # Ctrl-C while the resource starts
            self.close()
            raise
        if self._start_error is not None:
            self._thread.join()
            raise self._start_error

    def _thread_main(self) -> None:
        _owner.loop = self
        try:
            trio.run(self._main)
        except BaseException as e:
            if self._ready.is_set():
                self.error = e
                logger.exception("the trio loop of %s crashed", self.what)
            else:
                self._start_error = e
        finally:
            with self._lock:
                self._closing = True
                waiting, self._waiting = self._waiting, set()
            # Only if the loop crashed: every task resolves its caller's future before it ends.
            for future in waiting:
                if not future.done():
                    future.set_exception(self._closed_error("while the call ran"))
            self._ready.set()

    async def _main(self) -> None:
        async with self._resource as value, trio.open_nursery() as nursery:
            with self._lock:
                self.value, self._nursery = value, nursery
                # The token is how other threads reach this loop (run_sync_soon needs it).
                self._token = trio.lowlevel.current_trio_token()
                closing = self._closing
            # Callbacks have a limiter of their own: however many block, the resource's own
            # to_thread calls (a runtime joining its workers) still get a thread.
            self._callback_limiter = trio.CapacityLimiter(32)
            self._ready.set()
            if closing:
                nursery.cancel_scope.cancel()
            await trio.sleep_forever()

    @property
    def alive(self) -> bool:
        """Whether the loop's thread is still running."""
        return self._thread.is_alive()

    def _closed_error(self, when: str = "") -> FlowrtError:
        return FlowrtError(f"this {self.what} was closed {when}" if when else f"this {self.what} is closed")

    def _submit(self, fn: Callable[..., Any], *args: Any) -> None:
        """Queue ``fn(*args)`` to run in the loop; FlowrtError once ``close()`` has begun."""
        with self._lock:
            if self._closing:
                raise self._closed_error()
            # Queued under the lock, so it runs before close()'s cancel (the queue is FIFO):
            # every task accepted here starts, and sees the cancel if the loop closes.
            assert self._token is not None  # set before __init__ returned
            try:
                self._token.run_sync_soon(fn, *args)
            except trio.RunFinishedError:
                raise self._closed_error() from None

    def call_soon(self, async_fn: Callable[..., Awaitable[Any]], *args: Any) -> TrioCall:
        """Start ``async_fn(*args)`` as a task of the loop and return at once: its ``TrioCall``
        gets the result or the error (FlowrtError if the loop closes before or while it runs).
        """
        call = TrioCall(self)
        with self._lock:
            self._waiting.add(call.future)
        call.future.add_done_callback(self._forget)
        assert self._nursery is not None  # set before __init__ returned
        try:
            self._submit(self._nursery.start_soon, self._serve, call, async_fn, args)
        except BaseException as e:
            call.future.set_exception(e)
            raise
        return call

    def _forget(self, future: concurrent.futures.Future) -> None:
        with self._lock:
            self._waiting.discard(future)

    async def _serve(self, call: TrioCall, async_fn: Callable[..., Awaitable[Any]], args: tuple) -> None:
        """The task of one call: settles its future however it ends."""
        future = call.future
        try:
            with call.scope:
                future.set_result(await async_fn(*args))
        except BaseException as e:
            # The loop is closing: Cancelled, alone or in the group of a nursery it crossed.
            closing = isinstance(e, trio.Cancelled) or (
                isinstance(e, BaseExceptionGroup) and e.split(trio.Cancelled)[1] is None
            )
            future.set_exception(self._closed_error("while the call ran") if closing else e)
            if closing:
                raise
        if not future.done():  # cancelled by its caller (call.cancel())
            future.set_exception(FlowrtError(f"{self.what}: the call was interrupted"))

    def run(self, async_fn: Callable[..., Awaitable[T]], *args: Any) -> T:
        """Run ``async_fn(*args)`` in the loop and block the calling thread for its result.

        Works from any thread but the loop's own, a thread running another trio loop included
        (``trio.from_thread.run`` refuses those). FlowrtError if the loop is closed or closes
        while the call runs; KeyboardInterrupt in the waiting thread cancels the call.
        """
        if threading.current_thread() is self._thread:
            raise FlowrtError(
                f"{self.what}: a blocking call from the {self.what}'s own thread would wait for "
                "itself; make it from another thread"
            )
        call = self.call_soon(async_fn, *args)
        try:
            return call.future.result()
        except KeyboardInterrupt:
            call.cancel()
            raise

    def run_sync_soon(self, fn: Callable[..., Any], *args: Any) -> None:
        """Queue ``fn(*args)`` to run in the loop, also while it closes (calls queued from one
        thread run in that order, before any later ``call_soon`` task starts); nothing once
        the loop has ended. For wake-ups (``trio.Event.set``) and other quick sync work."""
        assert self._token is not None  # set before __init__ returned
        with contextlib.suppress(trio.RunFinishedError):
            self._token.run_sync_soon(fn, *args)

    def start_soon(self, async_fn: Callable[..., Awaitable[Any]], *args: Any) -> None:
        """Start ``async_fn(*args)`` as a task of the loop's nursery; returns at once.

        FlowrtError if the loop is closed. A task accepted here always starts, cancelled at
        once if ``close()`` follows, so it can tell its caller (a callback) why it ended.
        """
        assert self._nursery is not None  # set before __init__ returned
        self._submit(self._nursery.start_soon, async_fn, *args)

    async def call_in_thread(self, fn: Callable[..., Any], *args: Any) -> None:
        """From a task of the loop: call user code ``fn(*args)`` in a worker thread and wait.

        ``fn`` may block on this loop (``run``) or close it: that thread is not the loop's.
        Not cancelled: a callback, once started, runs to its end. Errors are logged, not raised.
        """
        with trio.CancelScope(shield=True):
            try:
                await trio.to_thread.run_sync(
                    self._call_as_owner,
                    fn,
                    *args,
                    thread_name=f"{self._thread.name}-callback",
                    limiter=self._callback_limiter,
                )
            except RuntimeError:  # no thread can start: the interpreter is shutting down
                logger.info(
                    "%s: no worker thread can start; calling the callback in the loop thread", self.what
                )
                self._call_as_owner(fn, *args)

    def _call_as_owner(self, fn: Callable[..., Any], *args: Any) -> None:
        previous = getattr(_owner, "loop", None)
        _owner.loop = self
        try:
            fn(*args)
        except Exception:  # the caller's bug must not take the loop down
            logger.exception("%s: a callback raised", self.what)
        finally:
            _owner.loop = previous

    def close(self) -> None:
        """Cancel every task of the loop, exit its resource and wait for the thread to end.

        Idempotent and safe from any thread. From the loop's own thread or one of its callbacks
        it only asks the loop to end (it would otherwise wait for itself): the thread ends once
        that callback returns.
        """
        with self._lock:
            first, self._closing = not self._closing, True
            token, nursery = self._token, self._nursery
        if first and token is not None:
            assert nursery is not None  # set with the token
            with contextlib.suppress(trio.RunFinishedError):
                token.run_sync_soon(nursery.cancel_scope.cancel)
        if getattr(_owner, "loop", None) is not self:
            self._thread.join()
