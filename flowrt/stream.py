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
and no task is left behind. Tasks outside the block that wait on the stream wake as they
would on a closed trio channel, with StreamClosedError (see
``flowrt.ordered_stream.OrderedStream``). An error leaving the block leaves as itself, not
in an exception group.

Under asyncio the same stream is used with ``asyncio.TaskGroup`` in place of the nursery (see
``flowrt.aio.AioStream``).

With ``max_batch`` > 1 (``model.stream(max_batch=8, max_delay=0.002)``) a stream is a dynamic
batcher, as Triton's: requests that arrive within ``max_delay`` seconds of the first waiting
one are stacked along the batch dimension, up to ``max_batch``, and run as one; each request
gets its own rows of the outputs back (see :class:`BatchingStream`).
"""

from __future__ import annotations

import collections
import copy
import functools
import math
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import attrs
import numpy as np
import trio

from flowrt.engine.graph.passes.batch import rebatch
from flowrt.engine.scheduler.device_array import DeviceArray
from flowrt.engine.scheduler.feeds import check_feeds
from flowrt.errors import FlowrtError, InputError, ShapeError
from flowrt.hints import StreamChoice, choose
from flowrt.ordered_stream import OrderedStream, Request
from flowrt.types import Priority, TensorInfo

if TYPE_CHECKING:
    from flowrt.loaded_network import LoadedNetwork


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
        request.done.set()  # not when cancelled: the stream fails it as it closes

    async def submit(self, feeds: Mapping[str, Any]) -> dict[str, np.ndarray]:
        """Run one request under the stream's bound and return its outputs directly (in the
        caller's task: cancelling the caller cancels the run). StreamClosedError if the
        stream closes before it has room, or before it finishes (the run is cancelled)."""
        await self._take_slot("submit")
        try:
            run = functools.partial(self.model.run, feeds, priority=self.priority)
            return await self._until_closed(self._run_waits, self._unfinished_message(), run)
        finally:
            self._slots.release()


def batch_sizes(max_batch: int) -> list[int]:
    """The batch sizes a batching stream loads: 1, the powers of two below ``max_batch``, and it."""
    sizes = [1]
    while sizes[-1] * 2 < max_batch:
        sizes.append(sizes[-1] * 2)
    return [*sizes, max_batch] if max_batch > 1 else sizes


def request_rows(inputs: Mapping[str, TensorInfo]) -> int:
    """The leading dim every request has (the batch the model was loaded for)."""
    leading = {info.shape[0] if info.shape else None for info in inputs.values()}
    rows = next(iter(leading), None)
    if len(leading) != 1 or not isinstance(rows, int):
        found = ", ".join(f"{name} {info}" for name, info in inputs.items())
        raise ShapeError(
            f"batching a stream needs inputs with one fixed leading (batch) dim, found {found}; "
            "load the model with batch=1"
        )
    return rows


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
    batcher forms a batch when a model instance is free. (A stream a hint configures waits
    for more only while another batch runs: see ``starts_when_idle``.) Results come back per request, in
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

    # Whether a batch formed while no other runs starts at once with the requests waiting
    # then, rather than waiting ``max_delay`` for more: the cores would idle meanwhile, so a
    # lone request pays no delay, and under load batches fill while others run. Off where
    # ``max_delay`` was given (it is then Triton's queue delay), on where a hint chose it.
    starts_when_idle = False

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
        self._rows = request_rows(self._inputs)
        # Proven now, so that a model that cannot be re-batched fails where the stream is made.
        rebatch(model.unbatched.graph.copy(), self._rows * max_batch)
        self._sizes = batch_sizes(max_batch)
        # how many batches of each number of requests it has run (as ``batch_counts[k]``)
        self.batch_counts: collections.Counter[int] = collections.Counter()
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
            # The requests still queued are failed by the stream, as every unfinished one.
            self._queue_in.close()
            self._queue_out.close()

    def _opened(self) -> None:
        self._check_open().start_soon(self._collect)

    def _closing(self) -> None:
        self._queue_in.close()

    def _launch(self, request: Request) -> None:
        try:
            request.feeds = check_feeds(self._inputs, request.feeds)
            for name, feed in request.feeds.items():
                if isinstance(feed, DeviceArray):
                    raise InputError(
                        f"input {name!r} is a DeviceArray: a batching stream joins its requests' "
                        "host arrays into batches; feed numpy arrays, or run it with model.run"
                    )
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
                alone = self._runs.value == self.model.pools.count - 1
                now = self.starts_when_idle and alone
                await self._fill(batch, trio.current_time() if now else sent_at + self.max_delay)
            except BaseException:
                # Left the stream while forming it: the stream fails these requests as it closes.
                if acquired:
                    self._runs.release()
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
        self.batch_counts[len(batch)] += 1
        try:
            outputs = await self._models[size].run(_stack(batch, size), priority=self.priority)
            rows = self._rows
            if size == 1:  # one request, its own outputs
                batch[0].values = outputs
            else:
                for i, request in enumerate(batch):
                    request.values = {n: v[i * rows : (i + 1) * rows].copy() for n, v in outputs.items()}
        except Exception as e:  # delivered to every request of the batch
            for request in batch:
                request.error = _own_copy(e)
        finally:
            self._runs.release()
        for request in batch:  # not when cancelled: the stream fails them as it closes
            request.done.set()


class HintedStream(BatchingStream):
    """A stream whose settings a performance hint chooses when it opens (``flowrt.hints``):
    use via ``model.stream(hint=...)``. Settings given explicitly win; ``choice`` holds what
    was chosen and why once the stream is open. A model that cannot be re-batched streams
    unbatched (the choice says so) unless ``max_batch`` > 1 was asked for explicitly. A
    batch starts at once when no other runs (``starts_when_idle``), unless ``max_delay``
    was given."""

    def __init__(
        self,
        model: LoadedNetwork,
        priority: Priority,
        hint: str,
        latency_budget: float | None,
        max_in_flight: int | None,
        max_batch: int | None,
        max_delay: float | None,
    ) -> None:
        OrderedStream.__init__(self, max_in_flight or 1)  # the bound is set when it opens
        self.model, self.priority = model, priority
        self.hint, self.latency_budget = hint, latency_budget
        self._given = (max_in_flight, max_batch, max_delay)
        self.max_batch, self.max_delay = max_batch or 1, max_delay or 0.0
        self._inputs = model.inputs
        self._rows = 1
        self._sizes = [1]
        self.batch_counts: collections.Counter[int] = collections.Counter()
        self._models: dict[int, LoadedNetwork] = {}
        self._runs = trio.Semaphore(model.pools.count)
        self._queue_in, self._queue_out = trio.open_memory_channel[tuple[float, Request]](math.inf)
        self.choice: StreamChoice | None = None

    async def __aenter__(self):
        if not self._entered:
            await self._configure()
        return await super().__aenter__()

    async def _configure(self) -> None:
        given_in_flight, given_batch, given_delay = self._given
        choice = await choose(self.model, self.hint, self.latency_budget)
        batch = choice.max_batch if given_batch is None else given_batch
        reason = choice.reason
        try:
            self._rows = request_rows(self._inputs)
            if batch > 1:
                rebatch(self.model.unbatched.graph.copy(), self._rows * batch)
        except ShapeError as e:
            if given_batch is not None and given_batch > 1:
                raise
            batch, reason = 1, f"{reason}; unbatched: {e}"
        in_flight = choice.max_in_flight if choice.max_batch == batch else 2 * self.model.pools.count * batch
        in_flight = in_flight if given_in_flight is None else given_in_flight
        delay = (choice.max_delay if batch > 1 else 0.0) if given_delay is None else given_delay
        self.starts_when_idle = given_delay is None
        self.max_in_flight, self._slots = in_flight, trio.Semaphore(in_flight)
        self.max_batch, self.max_delay, self._sizes = batch, delay, batch_sizes(batch)
        self.choice = attrs.evolve(
            choice, max_in_flight=in_flight, max_batch=batch, max_delay=delay, reason=reason
        )
