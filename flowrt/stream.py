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
class _Request:
    """One sent request: done when its run has finished, one way or another."""

    done: trio.Event = attrs.Factory(trio.Event)
    outputs: dict[str, np.ndarray] | None = None
    error: BaseException | None = None


class Stream:
    """A bounded, ordered flow of requests through one model; use via ``model.stream()``."""

    def __init__(self, model: LoadedNetwork, max_in_flight: int, priority: Priority) -> None:
        if not isinstance(max_in_flight, int) or max_in_flight < 1:
            raise FlowrtError(f"max_in_flight must be a positive int, got {max_in_flight!r}")
        self.model = model
        self.max_in_flight = max_in_flight
        self.priority = priority
        self._slots = trio.Semaphore(max_in_flight)
        self._pending: deque[_Request] = deque()
        self._arrived = trio.Event()
        self._closed = False
        self._nursery: trio.Nursery | None = None

    async def __aenter__(self) -> Stream:
        self._nursery_manager = trio.open_nursery()
        self._nursery = await self._nursery_manager.__aenter__()
        return self

    async def __aexit__(self, *exc_info: Any) -> bool | None:
        assert self._nursery is not None
        self._closed = True
        self._nursery.cancel_scope.cancel()  # whatever still runs belongs to no one now
        try:
            return await self._nursery_manager.__aexit__(*exc_info)
        finally:
            self._nursery = None

    # -- sending ----------------------------------------------------------------------------
    def _check_open(self) -> trio.Nursery:
        if self._closed or self._nursery is None:
            raise FlowrtError("the stream is closed: send within its 'async with' and before close()")
        return self._nursery

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
                f"the stream is full: {self.max_in_flight} requests in flight or not yet received"
            ) from None
        self._start(feeds)

    def _start(self, feeds: Mapping[str, Any]) -> None:
        request = _Request()
        self._pending.append(request)
        self._check_open().start_soon(self._run, feeds, request)
        self._arrived.set()

    async def _run(self, feeds: Mapping[str, Any], request: _Request) -> None:
        try:
            request.outputs = await self.model.run(feeds, priority=self.priority)
        except Exception as e:  # delivered to whoever receives this request
            request.error = e
        finally:
            request.done.set()

    def close(self) -> None:
        """No more sends; iteration ends once every sent request has been received."""
        self._closed = True
        self._arrived.set()

    # -- receiving --------------------------------------------------------------------------
    def __aiter__(self) -> Stream:
        return self

    async def __anext__(self) -> dict[str, np.ndarray]:
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
        return request.outputs  # type: ignore[return-value]

    async def submit(self, feeds: Mapping[str, Any]) -> dict[str, np.ndarray]:
        """Run one request under the stream's bound and return its outputs directly."""
        self._check_open()
        async with self._slots:
            return await self.model.run(feeds, priority=self.priority)
