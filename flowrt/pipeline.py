"""Pipelines: requests through several stages — loaded models and plain functions — overlapped.

::

    pipeline = flowrt.Pipeline([detector, crops_to_feeds, classifier])
    async with pipeline.stream() as s:           # the interface of a model stream
        await s.send({"image": frame})
        async for outputs in s:                  # submission order
            ...
    outputs = await pipeline.run({"image": frame})   # one request, stage after stage

Each stage takes requests in order from a bounded channel and hands them on, in the same
order, to the next stage's channel, so stage k works on request i while stage k+1 works on
request i-1. A model stage works on as many requests at once as the model has pools
(``rt.load(max_in_flight=...)``), so that a slow stage keeps every core busy; a function stage
works on one at a time. A stage is a ``LoadedNetwork`` (fed the previous stage's outputs, or the request's feeds
for the first) or a function, sync or async, ``fn(outputs)`` or ``fn(outputs, feeds)`` that
returns the next stage's feeds (``feeds``: the request's original feeds). A sync function runs
in the trio loop itself: keep it light, or make it async and move heavy work off the loop.

Under asyncio (models loaded by a runtime entered under ``asyncio.run``) the pipeline runs in
that runtime's trio thread, as its models do: a sync function stage runs there, an async one
as a task of the caller's asyncio loop.

A failure in one request's stage reaches that request's receiver as a RunError naming the
stage; the request skips the stages after it, and the other requests go on. Closing, and
errors leaving the ``async with``, are as for a model's stream
(``flowrt.ordered_stream.OrderedStream``).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import attrs
import trio

from flowrt.aio import AioStream, async_library, asyncio_stages
from flowrt.errors import ArgumentError, FlowrtError, RunError
from flowrt.loaded_network import LoadedNetwork
from flowrt.nursery import open_nursery
from flowrt.ordered_stream import OrderedStream, Request
from flowrt.types import Priority
from flowrt.validate import check_instance, check_int, check_priority

Stage = LoadedNetwork | Callable[..., Any]


@attrs.frozen
class _StageCall:
    """One stage, ready to call on a request's values."""

    name: str
    stage: Stage
    wants_feeds: bool  # a function stage that takes (outputs, feeds)

    @property
    def concurrency(self) -> int:
        """Requests this stage works on at once: a model's pool count, one for a function."""
        return self.stage.pools.count if isinstance(self.stage, LoadedNetwork) else 1

    async def __call__(self, values: Mapping[str, Any], feeds: Mapping[str, Any], priority: Priority) -> Any:
        if isinstance(self.stage, LoadedNetwork):
            return await self.stage.run(values, priority=priority)
        result = self.stage(values, feeds) if self.wants_feeds else self.stage(values)
        return await result if inspect.isawaitable(result) else result


def stage_call(index: int, stage: Any, name: str | None) -> _StageCall:
    """Stage ``index`` ready to call: a loaded model, or a function (taking the request's feeds
    when it has two positional parameters); FlowrtError for anything else."""
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
        if isinstance(stages, LoadedNetwork) or callable(stages):  # one stage, not in a list
            found = "one loaded model" if isinstance(stages, LoadedNetwork) else "one function"
            raise ArgumentError(
                f"Pipeline: stages must be a list of loaded models and functions, got {found} "
                "(a pipeline of one stage is Pipeline([stage]))"
            )
        check_instance("stages", stages, Sequence, "a list of loaded models and functions", where="Pipeline")
        stages = list(stages)
        if not stages:
            raise FlowrtError("a pipeline needs at least one stage")
        if names is not None and len(names) != len(stages):
            raise FlowrtError(f"{len(names)} names given for {len(stages)} pipeline stages")
        for i, name in enumerate(names or []):
            check_instance(f"names[{i}]", name, str, "a str", where="Pipeline")
        calls = [stage_call(i, s, None if names is None else names[i]) for i, s in enumerate(stages)]
        # Models loaded under asyncio: the stages run in their runtime's trio thread.
        self.stages, self._aio = asyncio_stages(calls)
        self.priority = check_priority(priority, where="Pipeline")

    @classmethod
    def of_calls(
        cls, calls: Sequence[Any], priority: Priority = Priority.MEDIUM, bridge: Any = None
    ) -> Pipeline:
        """A pipeline over stage calls made elsewhere (``flowrt.ray``'s, which run a stage
        on Ray actors): each has a ``name``, a ``concurrency`` and ``async __call__(values,
        feeds, priority)``. ``bridge``: the asyncio bridge its calls cross by, when made
        under asyncio. Its ``run`` and ``stream`` are a local pipeline's."""
        pipeline = cls.__new__(cls)
        pipeline.stages, pipeline._aio = list(calls), bridge
        pipeline.priority = check_priority(priority, where="Pipeline")
        return pipeline

    async def _through(self, call: _StageCall, request: Request) -> None:
        """Run one stage on a request, turning a failure into the request's RunError."""
        try:
            request.values = await call(request.values, request.feeds, self.priority)
        except RunError as e:
            request.error = RunError(e.layer, e.backend, e.cause, stage=call.name)
        except Exception as e:
            request.error = RunError(None, None, e, stage=call.name)

    async def run(self, feeds: Mapping[str, Any]) -> Any:
        """One request through every stage in turn; its last stage's result."""
        if self._aio is not None:
            return await self._aio.call(self._run, feeds)
        return await self._run(feeds)

    async def _run(self, feeds: Mapping[str, Any]) -> Any:
        request = Request(feeds, feeds)
        for call in self.stages:
            await self._through(call, request)
            if request.error is not None:
                raise request.error
        return request.values

    def stream(self, *, max_in_flight: int | None = None) -> PipelineStream | AioStream:
        """A bounded stream of requests through the stages, results in submission order.

        ``max_in_flight`` (default: twice the requests the stages work on at once) bounds the
        requests held at once — in a stage, between stages, or finished but not yet received.
        """
        if max_in_flight is None:
            max_in_flight = 2 * sum(call.concurrency for call in self.stages)
        stream = PipelineStream(self, check_int("max_in_flight", max_in_flight, where="Pipeline.stream"))
        if self._aio is not None:
            return AioStream(stream, self._aio)
        if async_library() == "asyncio":
            raise FlowrtError(
                "Pipeline.stream under asyncio needs a model stage loaded by a Runtime entered under "
                "asyncio (its stream runs in that runtime's trio thread); this pipeline has none"
            )
        return stream


class PipelineStream(OrderedStream):
    """The stream of a pipeline: ``send``/``send_nowait``/``submit``/``close`` and ``async for``,
    as a model's stream (``flowrt.stream.Stream``)."""

    what = "pipeline stream"

    def __init__(self, pipeline: Pipeline, max_in_flight: int) -> None:
        super().__init__(max_in_flight)
        self.pipeline = pipeline
        self._entry: trio.MemorySendChannel | None = None

    def _opened(self) -> None:
        # A channel in front of each stage; the slots bound them all, so none ever fills.
        send, receive = trio.open_memory_channel[Request](self.max_in_flight)
        self._entry = send
        for call in self.pipeline.stages:
            next_send, next_receive = trio.open_memory_channel[Request](self.max_in_flight)
            self._check_open().start_soon(self._serve, call, receive, next_send)
            receive = next_receive
        self._check_open().start_soon(self._finish, receive)

    def _launch(self, request: Request) -> None:
        request.values = request.feeds  # what the first stage takes
        assert self._entry is not None  # requests start once the stream is open
        self._entry.send_nowait(request)

    def _closing(self) -> None:
        assert self._entry is not None  # called on an open stream only
        self._entry.close()

    async def _serve(
        self, call: _StageCall, receive: trio.MemoryReceiveChannel, send: trio.MemorySendChannel
    ):
        """Work on up to ``call.concurrency`` requests at once; hand them on in arrival order."""
        limit = trio.Semaphore(call.concurrency)
        order_send, order_receive = trio.open_memory_channel[tuple[Request, trio.Event]](self.max_in_flight)
        async with open_nursery() as nursery:
            nursery.start_soon(self._hand_on, order_receive, send)
            async with receive, order_send:
                async for request in receive:
                    finished = trio.Event()
                    if request.error is None:
                        await limit.acquire()
                        nursery.start_soon(self._work, call, request, limit, finished)
                    else:
                        finished.set()
                    order_send.send_nowait((request, finished))

    async def _work(self, call: _StageCall, request: Request, limit: trio.Semaphore, finished: trio.Event):
        try:
            await self.pipeline._through(call, request)
        finally:
            limit.release()
            finished.set()

    @staticmethod
    async def _hand_on(order_receive: trio.MemoryReceiveChannel, send: trio.MemorySendChannel) -> None:
        async with order_receive, send:
            async for request, finished in order_receive:
                await finished.wait()
                send.send_nowait(request)

    async def _finish(self, receive: trio.MemoryReceiveChannel) -> None:
        async with receive:
            async for request in receive:
                request.done.set()
