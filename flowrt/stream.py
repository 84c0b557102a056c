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

With ``max_batch`` > 1 (``model.stream(max_batch=8, max_delay=0.002)``) a stream is a dynamic
batcher, as Triton's: requests that arrive within ``max_delay`` seconds of the first waiting
one are stacked along the batch dimension, up to ``max_batch``, and run as one; each request
gets its own rows of the outputs back (see :class:`BatchingStream`).
"""

from __future__ import annotations

import copy
import math
from collections import deque
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import attrs
import numpy as np
import trio

from flowrt.engine.graph.passes.batch import rebatch
from flowrt.engine.scheduler.feeds import check_feeds
from flowrt.errors import FlowrtError, ResourceError, ShapeError
from flowrt.types import Priority, TensorInfo

if TYPE_CHECKING:
    from flowrt.loaded_network import LoadedNetwork


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


def batch_sizes(max_batch: int) -> list[int]:
    """The batch sizes a batching stream loads: 1, the powers of two below ``max_batch``, and it."""
    sizes = [1]
    while sizes[-1] * 2 < max_batch:
        sizes.append(sizes[-1] * 2)
    return [*sizes, max_batch] if max_batch > 1 else sizes


def _request_rows(inputs: Mapping[str, TensorInfo]) -> int:
    """The leading dim every request has (the batch the model was loaded for)."""
    leading = {info.shape[0] if info.shape else None for info in inputs.values()}
    if len(leading) != 1 or not isinstance(next(iter(leading)), int):
        found = ", ".join(f"{name} {info}" for name, info in inputs.items())
        raise ShapeError(
            f"batching a stream needs inputs with one fixed leading (batch) dim, found {found}; "
            "load the model with batch=1"
        )
    return next(iter(leading))


def _stack(batch: list[Request], size: int) -> Mapping[str, Any]:
    """The feeds of ``batch`` stacked along axis 0, padded to ``size`` requests with copies of
    the last one (real data: padding rows run like any other and are dropped)."""
    feeds = [r.feeds for r in batch]
    feeds += [feeds[-1]] * (size - len(feeds))
    if len(feeds) == 1:
        return feeds[0]
    return {name: np.concatenate([f[name] for f in feeds]) for name in feeds[0]}


def _own_copy(error: Exception) -> Exception:
    """One exception object per request, so that raising it in one caller leaves the others'
    traceback alone."""
    try:
        return copy.copy(error)
    except Exception:
        return error


class BatchingStream(OrderedStream):
    """A stream that stacks requests and runs them as one; use via ``model.stream(max_batch=...)``.

    A collector actor takes the first waiting request, waits until a run can start (fewer
    batches running than the model has memory pools: a batch formed before then would only
    wait for a pool, while the requests behind it could have joined it), then takes more
    until ``max_batch`` are taken or ``max_delay`` seconds have passed since that first one
    was sent (at once once the stream is closed), and starts the batch: as Triton's dynamic
    batcher forms a batch when a model instance is free. Results come back per request, in
    submission order; ``max_in_flight`` bounds the requests held, as for any stream. A
    request whose feeds do not match the model fails alone, when sent; an error in a batched
    run reaches every request of that batch.

    Partial batches: when the stream opens, the model is loaded (``model.batched``, kept
    for later streams) for 1, the powers of two below ``max_batch``, and ``max_batch``
    requests; a batch of k runs on the smallest of those sizes that holds it, padded with
    copies of its last request. Each size is a load of its own (workloads prepared, memory
    planned, pools allocated): loading every size up to ``max_batch`` costs that many loads,
    and loading ``max_batch`` alone makes a lone request pay for ``max_batch`` samples when
    traffic is light. Powers of two need about log2(``max_batch``) loads and never spend
    half of a run on padding. Loading at open keeps load time out of request latency.
    """

    def __init__(
        self, model: LoadedNetwork, max_in_flight: int, priority: Priority, max_batch: int, max_delay: float
    ) -> None:
        if not isinstance(max_batch, int) or isinstance(max_batch, bool) or max_batch < 1:
            raise FlowrtError(f"max_batch must be a positive int, got {max_batch!r}")
        if not isinstance(max_delay, int | float) or not max_delay >= 0:
            raise FlowrtError(f"max_delay must be a number of seconds >= 0, got {max_delay!r}")
        super().__init__(max_in_flight)
        self.model, self.priority = model, priority
        self.max_batch, self.max_delay = max_batch, float(max_delay)
        self._inputs = model.inputs
        self._rows = _request_rows(self._inputs)
        # Proven now, so that a model that cannot be re-batched fails where the stream is made.
        rebatch(model.unbatched.graph.copy(), self._rows * max_batch)
        self._sizes = batch_sizes(max_batch)
        self._models: dict[int, LoadedNetwork] = {}
        self._runs = trio.Semaphore(model.pools.count)  # batches that may run at once
        self._queue_in, self._queue_out = trio.open_memory_channel[tuple[float, Request]](math.inf)

    async def __aenter__(self):
        for size in self._sizes:
            self._models[size] = await self.model.batched(size * self._rows) if size > 1 else self.model
        return await super().__aenter__()

    async def __aexit__(self, *exc_info: Any) -> bool | None:
        try:
            return await super().__aexit__(*exc_info)
        finally:
            self._queue_in.close()
            while True:
                try:
                    _, request = self._queue_out.receive_nowait()
                except (trio.WouldBlock, trio.EndOfChannel):
                    break
                self._finish([request])

    def _opened(self) -> None:
        self._check_open().start_soon(self._collect)

    def _closing(self) -> None:
        self._queue_in.close()

    def _launch(self, request: Request) -> None:
        try:
            request.feeds = check_feeds(self._inputs, request.feeds)
        except FlowrtError as e:
            request.error = e
            request.done.set()
            return
        self._queue_in.send_nowait((trio.current_time(), request))

    async def _collect(self) -> None:
        """The actor that forms batches, one at a time, and starts each as it is formed."""
        async for sent_at, first in self._queue_out:
            batch, acquired = [first], False
            try:
                await self._runs.acquire()  # released by _run_batch
                acquired = True
                await self._fill(batch, sent_at + self.max_delay)
            except BaseException:
                # left the stream while forming it: these requests are in no queue any more
                if acquired:
                    self._runs.release()
                self._finish(batch)
                raise
            assert self._nursery is not None  # this task runs in it
            self._nursery.start_soon(self._run_batch, batch)

    async def _fill(self, batch: list[Request], deadline: float) -> None:
        """Add waiting requests to ``batch``, then those that come before ``deadline``."""
        while len(batch) < self.max_batch:
            try:
                batch.append(self._queue_out.receive_nowait()[1])
                continue
            except trio.WouldBlock:
                pass
            except trio.EndOfChannel:
                return
            with trio.move_on_at(deadline) as timer:
                try:
                    batch.append((await self._queue_out.receive())[1])
                except trio.EndOfChannel:
                    return
            if timer.cancelled_caught:
                return

    async def _run_batch(self, batch: list[Request]) -> None:
        size = next(s for s in self._sizes if s >= len(batch))
        try:
            outputs = await self._models[size].run(_stack(batch, size), priority=self.priority)
            rows = self._rows
            for i, request in enumerate(batch):
                request.values = {n: v[i * rows : (i + 1) * rows].copy() for n, v in outputs.items()}
        except Exception as e:  # delivered to every request of the batch
            for request in batch:
                request.error = _own_copy(e)
        finally:
            self._runs.release()
            self._finish(batch)

    @staticmethod
    def _finish(batch: list[Request]) -> None:
        for request in batch:
            if request.values is None and request.error is None:
                request.error = FlowrtError("the stream closed before this request finished")
            request.done.set()
