"""Pipelines: requests through several stages — loaded models and plain functions — overlapped.

::

    pipeline = flowrt.Pipeline([detector, crops_to_feeds, classifier])
    async with pipeline.stream() as s:           # the interface of a model stream
        await s.send({"image": frame})
        async for outputs in s:                  # submission order
            ...
    outputs = await pipeline.run({"image": frame})   # one request, stage after stage

Each stage is one task that takes requests in order from a bounded channel and hands them on
to the next stage's channel, so stage k works on request i while stage k+1 works on request
i-1. A stage is a ``LoadedNetwork`` (fed the previous stage's outputs, or the request's feeds
for the first) or a function, sync or async, ``fn(outputs)`` or ``fn(outputs, feeds)`` that
returns the next stage's feeds (``feeds``: the request's original feeds). A sync function runs
in the trio loop itself: keep it light, or make it async and move heavy work off the loop.

A failure in one request's stage reaches that request's receiver as a RunError naming the
stage; the request skips the stages after it, and the other requests go on.
"""

from __future__ import annotations

import inspect
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import attrs
import numpy as np
import trio

from flowrt.errors import FlowrtError, ResourceError, RunError
from flowrt.runtime import LoadedNetwork
from flowrt.types import Priority

Stage = LoadedNetwork | Callable[..., Any]


@attrs.frozen
class _StageCall:
    """One stage, ready to call on a request's values."""

    name: str
    stage: Stage
    wants_feeds: bool  # a function stage that takes (outputs, feeds)

    async def __call__(self, values: Mapping[str, Any], feeds: Mapping[str, Any], priority: Priority) -> Any:
        if isinstance(self.stage, LoadedNetwork):
            return await self.stage.run(values, priority=priority)
        result = self.stage(values, feeds) if self.wants_feeds else self.stage(values)
        return await result if inspect.isawaitable(result) else result


def _stage_call(index: int, stage: Any, name: str | None) -> _StageCall:
    if isinstance(stage, LoadedNetwork):
        return _StageCall(name or f"{index}: model", stage, False)
    if not callable(stage):
        raise FlowrtError(
            f"pipeline stage {index} must be a loaded model or a function, got {type(stage).__name__}"
        )
    try:
        positional = [
            p
            for p in inspect.signature(stage).parameters.values()
            if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.VAR_POSITIONAL)
        ]
    except (TypeError, ValueError):  # a builtin without a signature: give it the outputs alone
        positional = []
    wants_feeds = len(positional) >= 2 or any(p.kind is p.VAR_POSITIONAL for p in positional)
    return _StageCall(
        name or f"{index}: {getattr(stage, '__name__', type(stage).__name__)}", stage, wants_feeds
    )


@attrs.define(eq=False)
class _Request:
    feeds: Mapping[str, Any]
    values: Any = None
    error: RunError | None = None
    done: trio.Event = attrs.Factory(trio.Event)


class Pipeline:
    """Stages run overlapped over a stream of requests (see the module doc).

    ``names`` labels the stages in errors (default: ``"<index>: model"`` or the function's
    name). ``priority`` is that of the model runs (default MEDIUM).
    """

    def __init__(
        self,
        stages: Sequence[Stage],
        *,
        names: Sequence[str] | None = None,
        priority: Priority = Priority.MEDIUM,
    ) -> None:
        stages = list(stages)
        if not stages:
            raise FlowrtError("a pipeline needs at least one stage")
        if names is not None and len(names) != len(stages):
            raise FlowrtError(f"{len(names)} names given for {len(stages)} pipeline stages")
        self.stages = [_stage_call(i, s, None if names is None else names[i]) for i, s in enumerate(stages)]
        self.priority = priority

    async def _through(self, call: _StageCall, request: _Request) -> None:
        """Run one stage on a request, turning a failure into the request's RunError."""
        try:
            request.values = await call(request.values, request.feeds, self.priority)
        except RunError as e:
            request.error = RunError(e.layer, e.backend, e.cause, stage=call.name)
        except Exception as e:
            request.error = RunError(None, None, e, stage=call.name)

    async def run(self, feeds: Mapping[str, Any]) -> Any:
        """One request through every stage in turn; its last stage's result."""
        request = _Request(feeds, feeds)
        for call in self.stages:
            await self._through(call, request)
            if request.error is not None:
                raise request.error
        return request.values

    def stream(self, *, max_in_flight: int | None = None) -> PipelineStream:
        """A bounded stream of requests through the stages, results in submission order.

        ``max_in_flight`` (default: twice the number of stages) bounds the requests held at
        once — in a stage, between stages, or finished but not yet received.
        """
        return PipelineStream(self, 2 * len(self.stages) if max_in_flight is None else max_in_flight)


class PipelineStream:
    """The stream of a pipeline: ``send``/``send_nowait``/``submit``/``close`` and ``async for``,
    as a model's stream (``flowrt.stream.Stream``)."""

    def __init__(self, pipeline: Pipeline, max_in_flight: int) -> None:
        if not isinstance(max_in_flight, int) or max_in_flight < 1:
            raise FlowrtError(f"max_in_flight must be a positive int, got {max_in_flight!r}")
        self.pipeline = pipeline
        self.max_in_flight = max_in_flight
        self._slots = trio.Semaphore(max_in_flight)
        self._pending: deque[_Request] = deque()
        self._arrived = trio.Event()
        self._closed = False
        self._nursery: trio.Nursery | None = None
        self._entry: trio.MemorySendChannel | None = None

    async def __aenter__(self) -> PipelineStream:
        self._nursery_manager = trio.open_nursery()
        self._nursery = await self._nursery_manager.__aenter__()
        # A channel in front of each stage; the slots bound them all, so none ever fills.
        send, receive = trio.open_memory_channel[_Request](self.max_in_flight)
        self._entry = send
        for call in self.pipeline.stages:
            next_send, next_receive = trio.open_memory_channel[_Request](self.max_in_flight)
            self._nursery.start_soon(self._serve, call, receive, next_send)
            receive = next_receive
        self._nursery.start_soon(self._finish, receive)
        return self

    async def __aexit__(self, *exc_info: Any) -> bool | None:
        assert self._nursery is not None
        self._closed = True
        self._nursery.cancel_scope.cancel()  # whatever still runs belongs to no one now
        try:
            return await self._nursery_manager.__aexit__(*exc_info)
        finally:
            self._nursery = None

    async def _serve(
        self, call: _StageCall, receive: trio.MemoryReceiveChannel, send: trio.MemorySendChannel
    ):
        async with receive, send:
            async for request in receive:
                if request.error is None:
                    await self.pipeline._through(call, request)
                send.send_nowait(request)

    async def _finish(self, receive: trio.MemoryReceiveChannel) -> None:
        async with receive:
            async for request in receive:
                request.done.set()

    # -- sending ----------------------------------------------------------------------------
    def _check_open(self) -> trio.MemorySendChannel:
        if self._closed or self._entry is None:
            raise FlowrtError(
                "the pipeline stream is closed: send within its 'async with' and before close()"
            )
        return self._entry

    def _start(self, feeds: Mapping[str, Any], tracked: bool = True) -> _Request:
        request = _Request(feeds, feeds)
        if tracked:
            self._pending.append(request)
            self._arrived.set()
        self._check_open().send_nowait(request)
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
                f"the pipeline stream is full: {self.max_in_flight} requests in flight or not yet received"
            ) from None
        self._start(feeds)

    async def submit(self, feeds: Mapping[str, Any]) -> Any:
        """Run one request through the stages under the stream's bound and return its result."""
        self._check_open()
        async with self._slots:
            request = self._start(feeds, tracked=False)
            await request.done.wait()
        if request.error is not None:
            raise request.error
        return request.values

    def close(self) -> None:
        """No more sends; iteration ends once every sent request has been received."""
        if not self._closed and self._entry is not None:
            self._entry.close()
        self._closed = True
        self._arrived.set()

    # -- receiving --------------------------------------------------------------------------
    def __aiter__(self) -> PipelineStream:
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
        return request.values
