"""The machinery every flowrt stream shares: a bound on the requests held, sending, closing
and receiving in submission order. Model streams (``flowrt.stream``) and pipeline streams
(``flowrt.pipeline``) say how a request is worked on.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from typing import Any

import attrs
import trio

from flowrt.errors import FlowrtError, ResourceError, StreamClosedError
from flowrt.nursery import open_nursery


@attrs.define(eq=False)
class Request:
    """One sent request: done when its work has finished, one way or another, with its
    result (``values``) or its ``error``."""

    feeds: Mapping[str, Any]
    values: Any = None
    error: BaseException | None = None
    done: trio.Event = attrs.Factory(trio.Event)


class OrderedStream:
    """What every flowrt stream shares: at most ``max_in_flight`` requests held, ``send`` /
    ``send_nowait`` / ``submit`` / ``close``, and results received in submission order.

    Closing follows trio's memory channels. ``close()`` is the send side closing: a ``send``
    or ``submit`` waiting for room, then or later, raises StreamClosedError (also a
    ``trio.ClosedResourceError``), and ``async for`` ends once every sent request has been
    received. Leaving the ``async with`` closes the whole stream, for tasks outside it too:
    waiting sends raise StreamClosedError, each request still running is cancelled and its
    receiver (or submitter) gets StreamClosedError, results already finished can still be
    received, and then ``async for`` ends. Errors leave the block as themselves (see
    ``flowrt.nursery``).

    A subclass says how a request is worked on: ``_launch(request)`` starts it (in
    ``self._nursery``) and sets ``request.done`` when it ends (not when it is cancelled: the
    stream fails what is left when it closes); ``_opened()`` may start tasks when the stream
    opens, ``_closing()`` runs at ``close()``.
    """

    what = "stream"

    def __init__(self, max_in_flight: int) -> None:
        if not isinstance(max_in_flight, int) or max_in_flight < 1:
            raise FlowrtError(f"max_in_flight must be a positive int, got {max_in_flight!r}")
        self.max_in_flight = max_in_flight
        self._slots = trio.Semaphore(max_in_flight)
        self._pending: deque[Request] = deque()  # sent, not yet received, in order
        self._live: set[Request] = set()  # sent or submitted, not yet received or returned
        self._arrived = trio.Event()
        self._closed = False
        self._entered = False
        self._nursery: trio.Nursery | None = None
        # Tasks waiting for room (woken by close() and by the end of the block), and
        # submits running in their caller's task (woken by the end of the block).
        self._room_waits: set[trio.CancelScope] = set()
        self._run_waits: set[trio.CancelScope] = set()

    async def __aenter__(self):
        if self._entered:
            raise StreamClosedError(
                f"the {self.what} was opened before: make a new one for each 'async with'"
            )
        self._entered = True
        self._nursery_manager = open_nursery()
        self._nursery = await self._nursery_manager.__aenter__()
        self._opened()
        return self

    async def __aexit__(self, *exc_info: Any) -> bool | None:
        assert self._nursery is not None
        self._closed = True
        self._wake(self._room_waits | self._run_waits)
        self._arrived.set()  # a receiver with nothing pending ends its iteration
        self._nursery.cancel_scope.cancel()  # whatever still runs belongs to no one now
        try:
            return await self._nursery_manager.__aexit__(*exc_info)
        finally:
            self._nursery = None
            self._fail_unfinished()

    def _opened(self) -> None:
        """Start the stream's own tasks, if any (the nursery is open)."""

    def _closing(self) -> None:
        """No more requests will come (``close()``)."""

    def _launch(self, request: Request) -> None:
        raise NotImplementedError

    # -- closing ----------------------------------------------------------------------------
    @staticmethod
    def _wake(waits: set[trio.CancelScope]) -> None:
        for scope in waits:
            scope.cancel()

    async def _until_closed(self, waits: set[trio.CancelScope], message: str, fn: Any, *args: Any) -> Any:
        """``await fn(*args)``, or raise StreamClosedError(``message``) if the scopes in
        ``waits`` are woken first (an outer cancellation still leaves as Cancelled)."""
        scope = trio.CancelScope()
        waits.add(scope)
        try:
            with scope:
                return await fn(*args)
        finally:
            waits.discard(scope)
        raise StreamClosedError(message)

    def _unfinished_message(self) -> str:
        return f"the {self.what} closed before this request finished: its 'async with' ended"

    def _fail_unfinished(self) -> None:
        """The block has ended and its tasks with it: every request they left unfinished
        fails, so that whoever waits for it (a receiver, a submitter) wakes."""
        for request in self._live:
            if not request.done.is_set():
                request.error = StreamClosedError(self._unfinished_message())
                request.done.set()

    # -- sending ----------------------------------------------------------------------------
    def _check_open(self) -> trio.Nursery:
        if self._closed:
            raise StreamClosedError(
                f"the {self.what} is closed: send within its 'async with' and before close()"
            )
        if self._nursery is None:
            raise FlowrtError(f"the {self.what} is not open yet: send within its 'async with'")
        return self._nursery

    async def _take_slot(self, operation: str) -> None:
        """Wait for room; StreamClosedError if the stream closes first."""
        self._check_open()
        message = (
            f"the {self.what} was closed while this {operation} waited for room "
            f"({self.max_in_flight} requests in flight or not yet received)"
        )
        await self._until_closed(self._room_waits, message, self._slots.acquire)
        if self._closed:  # closed after the slot was handed over, before this task resumed
            self._slots.release()
            self._check_open()

    def _start(self, feeds: Mapping[str, Any], tracked: bool = True) -> Request:
        self._check_open()
        request = Request(feeds)
        self._live.add(request)
        if tracked:
            self._pending.append(request)
            self._arrived.set()
        self._launch(request)
        return request

    async def send(self, feeds: Mapping[str, Any]) -> None:
        """Queue a request; waits while ``max_in_flight`` requests are held (backpressure).
        StreamClosedError if the stream is closed, or closes while this waits."""
        await self._take_slot("send")
        self._start(feeds)

    def send_nowait(self, feeds: Mapping[str, Any]) -> None:
        """Queue a request now, or raise ResourceError when the stream is full."""
        self._check_open()
        try:
            self._slots.acquire_nowait()
        except trio.WouldBlock:
            raise ResourceError(
                f"the {self.what} is full: {self.max_in_flight} requests in flight or not yet received"
            ) from None
        self._start(feeds)

    async def submit(self, feeds: Mapping[str, Any]) -> Any:
        """Run one request under the stream's bound and return its result directly.
        StreamClosedError if the stream closes before it has room, or before it finishes."""
        await self._take_slot("submit")
        try:
            request = self._start(feeds, tracked=False)
            try:
                await request.done.wait()
            finally:
                self._live.discard(request)
        finally:
            self._slots.release()
        if request.error is not None:
            raise request.error
        return request.values

    def close(self) -> None:
        """No more sends (waiting ones raise StreamClosedError); iteration ends once every
        sent request has been received."""
        if not self._closed and self._nursery is not None:
            self._closing()
        self._closed = True
        self._wake(self._room_waits)
        self._arrived.set()

    # -- receiving --------------------------------------------------------------------------
    def __aiter__(self):
        return self

    async def __anext__(self) -> Any:
        while True:
            while not self._pending:
                if self._closed:
                    raise StopAsyncIteration
                if self._arrived.is_set():  # a fresh one, leaving those that others wait on set
                    self._arrived = trio.Event()
                await self._arrived.wait()
            request = self._pending[0]
            await request.done.wait()
            if self._pending and self._pending[0] is request:  # not taken by another receiver
                break
        self._pending.popleft()
        self._live.discard(request)
        self._slots.release()
        if request.error is not None:
            raise request.error
        return request.values
