"""Streams: many requests through one loaded model, bounded, results in submission order.

::

    async with model.stream(max_in_flight=4) as s:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(feed_camera, s)      # await s.send(feeds) ...; s.close()
            async for outputs in s:                 # in the order they were sent
                show(outputs)

    outputs = await s.submit(feeds)                 # request style, same bound

At most ``max_in_flight`` requests are held by a stream at once — running, or finished but
not yet taken by the consumer — so ``send`` waits when the consumer falls behind
(backpressure) and nothing is ever dropped; ``send_nowait`` raises ResourceError instead of
waiting. Leaving the ``async with`` cancels what is still running; every pool is given back
and no task is left behind.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import attrs
import numpy as np
import trio

from flowrt.errors import FlowrtError, ResourceError
from flowrt.types import Priority

if TYPE_CHECKING:
    from flowrt.runtime import LoadedNetwork


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

    A subclass says how a request is worked on: ``_launch(request)`` starts it (in
    ``self._nursery``) and sets ``request.done`` when it ends; ``_opened()`` may start tasks
    when the stream opens, ``_closing()`` runs at ``close()``.
    """

    what = "stream"

    def __init__(self, max_in_flight: int) -> None:
        if not isinstance(max_in_flight, int) or max_in_flight < 1:
            raise FlowrtError(f"max_in_flight must be a positive int, got {max_in_flight!r}")
        self.max_in_flight = max_in_flight
        self._slots = trio.Semaphore(max_in_flight)
        self._pending: deque[Request] = deque()
        self._arrived = trio.Event()
        self._closed = False
        self._nursery: trio.Nursery | None = None

    async def __aenter__(self):
        self._nursery_manager = trio.open_nursery()
        self._nursery = await self._nursery_manager.__aenter__()
        self._opened()
        return self

    async def __aexit__(self, *exc_info: Any) -> bool | None:
        assert self._nursery is not None
        self._closed = True
        self._nursery.cancel_scope.cancel()  # whatever still runs belongs to no one now
        try:
            return await self._nursery_manager.__aexit__(*exc_info)
        finally:
            self._nursery = None

    def _opened(self) -> None:
        """Start the stream's own tasks, if any (the nursery is open)."""

    def _closing(self) -> None:
        """No more requests will come (``close()``)."""

    def _launch(self, request: Request) -> None:
        raise NotImplementedError

    # -- sending ----------------------------------------------------------------------------
    def _check_open(self) -> trio.Nursery:
        if self._closed or self._nursery is None:
            raise FlowrtError(f"the {self.what} is closed: send within its 'async with' and before close()")
        return self._nursery

    def _start(self, feeds: Mapping[str, Any], tracked: bool = True) -> Request:
        self._check_open()
        request = Request(feeds)
        if tracked:
            self._pending.append(request)
            self._arrived.set()
        self._launch(request)
        return request

    async def send(self, feeds: Mapping[str, Any]) -> None:
        """Queue a request; waits while ``max_in_flight`` requests are held (backpressure)."""
        self._check_open()
        await self._slots.acquire()
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
        """Run one request under the stream's bound and return its result directly."""
        self._check_open()
        async with self._slots:
            request = self._start(feeds, tracked=False)
            await request.done.wait()
        if request.error is not None:
            raise request.error
        return request.values

    def close(self) -> None:
        """No more sends; iteration ends once every sent request has been received."""
        if not self._closed and self._nursery is not None:
            self._closing()
        self._closed = True
        self._arrived.set()

    # -- receiving --------------------------------------------------------------------------
    def __aiter__(self):
        return self

    async def __anext__(self) -> Any:
        while not self._pending:
            if self._closed:
                raise StopAsyncIteration
            self._arrived = trio.Event()
            await self._arrived.wait()
        request = self._pending[0]
        await request.done.wait()
        self._pending.popleft()
        self._slots.release()
        if request.error is not None:
            raise request.error
        return request.values


class Stream(OrderedStream):
    """A bounded, ordered flow of requests through one model; use via ``model.stream()``."""

    def __init__(self, model: LoadedNetwork, max_in_flight: int, priority: Priority) -> None:
        super().__init__(max_in_flight)
        self.model = model
        self.priority = priority

    def _launch(self, request: Request) -> None:
        self._check_open().start_soon(self._run, request)

    async def _run(self, request: Request) -> None:
        try:
            request.values = await self.model.run(request.feeds, priority=self.priority)
        except Exception as e:  # delivered to whoever receives this request
            request.error = e
        finally:
            request.done.set()

    async def submit(self, feeds: Mapping[str, Any]) -> dict[str, np.ndarray]:
        """Run one request under the stream's bound and return its outputs directly (in the
        caller's task: cancelling the caller cancels the run)."""
        self._check_open()
        async with self._slots:
            return await self.model.run(feeds, priority=self.priority)
