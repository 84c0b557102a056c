"""The asyncio faces of a loaded network and of its streams (see ``flowrt.aio.bridge``): the
objects a runtime entered under asyncio hands out, each forwarding to the trio-side object it
stands for."""

from __future__ import annotations

import concurrent.futures
import functools
import inspect
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any

import attrs
import numpy as np
import trio

from flowrt.aio.bridge import AsyncioBridge
from flowrt.errors import ArgumentError, FlowrtError
from flowrt.loaded_network import LoadedNetwork
from flowrt.ordered_stream import OrderedStream
from flowrt.trio_thread import TrioCall
from flowrt.types import Priority

_END = object()  # a stream's iteration ended (StopAsyncIteration does not cross futures well)


class AioLoadedNetwork(LoadedNetwork):
    """A ``LoadedNetwork`` as ``rt.load`` returns it under asyncio.

    Its attributes, properties and sync methods (``inputs``, ``outputs``, ``pools``,
    ``profile()``, ``memory_report()``, ...) are the network's own, read and written through;
    ``run``, ``batched`` and ``unload`` await the network's own in the runtime's trio thread;
    ``stream`` returns the network's stream wrapped in an ``AioStream``.
    """

    def __init__(self, target: LoadedNetwork, bridge: AsyncioBridge) -> None:
        # Not LoadedNetwork.__init__: this object holds no state of its own.
        object.__setattr__(self, "_target", target)
        object.__setattr__(self, "_bridge", bridge)

    def __getattr__(self, name: str) -> Any:
        if name in ("_target", "_bridge"):
            raise AttributeError(name)
        return getattr(self._target, name)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self._target, name, value)

    async def run(
        self,
        feeds: Mapping[str, Any],
        *,
        priority: Priority = Priority.MEDIUM,
        outputs: Mapping[str, np.ndarray] | None = None,
        profile: bool | None = None,
        device_outputs: bool | Collection[str] = False,
    ) -> dict[str, Any]:
        """``LoadedNetwork.run`` in the runtime's trio thread; cancelling the calling task
        cancels the run, which gives its memory pool back before the CancelledError goes on."""
        run = functools.partial(
            self._target.run,
            feeds,
            priority=priority,
            outputs=outputs,
            profile=profile,
            device_outputs=device_outputs,
        )
        return await self._bridge.call(run)

    def stream(self, **options: Any) -> AioStream:  # type: ignore[override]  # the asyncio face of a Stream
        """``LoadedNetwork.stream(**options)``, used from asyncio (see ``AioStream``)."""
        return AioStream(self._target.stream(**options), self._bridge)

    async def batched(self, batch: int) -> LoadedNetwork:
        """``LoadedNetwork.batched``, loaded in the runtime's trio thread."""
        model = await self._bridge.call(self._target.batched, batch)
        return self if model is self._target else AioLoadedNetwork(model, self._bridge)

    async def unload(self) -> None:
        """``LoadedNetwork.unload``, in the runtime's trio thread."""
        await self._bridge.call(self._target.unload)


def trio_side(model: LoadedNetwork) -> LoadedNetwork:
    """The network an ``AioLoadedNetwork`` stands for (any other network as it is)."""
    return model._target if isinstance(model, AioLoadedNetwork) else model


async def _next(stream: OrderedStream) -> Any:
    try:
        return await stream.__anext__()
    except StopAsyncIteration:
        return _END


def _fail_opening(opened: concurrent.futures.Future, holder: concurrent.futures.Future) -> None:
    """The holder ended before the stream opened: its error is the opening's."""
    if not opened.done():
        opened.set_exception(holder.exception() or FlowrtError("the stream ended before it opened"))


class AioStream:
    """A stream (``model.stream()``, ``pipeline.stream()``) used from asyncio.

    The same methods and attributes as the stream it wraps, which lives in the runtime's trio
    thread, held open there by a task from ``async with`` to its end (a trio stream's nursery
    must open and close in one task). ``send_nowait`` blocks the asyncio loop for one thread
    crossing; ``close()`` returns at once and takes effect before any later call.
    """

    def __init__(self, stream: OrderedStream, bridge: AsyncioBridge) -> None:
        self._stream = stream
        self._bridge = bridge
        self._leave = trio.Event()
        self._holder: TrioCall | None = None

    def __getattr__(self, name: str) -> Any:
        if name == "_stream":
            raise AttributeError(name)
        return getattr(self._stream, name)

    async def _hold(self, opened: concurrent.futures.Future) -> None:
        async with self._stream:
            opened.set_result(None)
            await self._leave.wait()

    async def __aenter__(self) -> AioStream:
        opened: concurrent.futures.Future = concurrent.futures.Future()
        holder = self._bridge.thread.call_soon(self._hold, opened)
        holder.future.add_done_callback(functools.partial(_fail_opening, opened))
        await self._bridge.wait(opened, holder)
        self._holder = holder
        return self

    async def __aexit__(self, *exc_info: Any) -> None:
        # The body's exception is not handed to the trio side: it leaves the block as itself.
        # What still runs is cancelled there, every pool given back, before this returns.
        holder = self._holder
        assert holder is not None, "__aexit__ without __aenter__"
        self._bridge.thread.run_sync_soon(self._leave.set)
        await self._bridge.wait(holder.future, holder)

    async def send(self, feeds: Mapping[str, Any]) -> None:
        """``send`` (see ``flowrt.ordered_stream.OrderedStream``), in the trio thread."""
        await self._bridge.call(self._stream.send, feeds)

    def send_nowait(self, feeds: Mapping[str, Any]) -> None:
        """``send_nowait``: queued now, or ResourceError when the stream is full."""
        self._bridge.call_nowait(self._stream.send_nowait, feeds)

    async def submit(self, feeds: Mapping[str, Any]) -> Any:
        """``submit``: one request under the stream's bound, its result returned."""
        return await self._bridge.call(self._stream.submit, feeds)

    def close(self) -> None:
        """``close``: no more sends; iteration ends once every sent request is received."""
        self._bridge.thread.run_sync_soon(self._stream.close)

    def __aiter__(self) -> AioStream:
        return self

    async def __anext__(self) -> Any:
        value = await self._bridge.call(_next, self._stream)
        if value is _END:
            raise StopAsyncIteration
        return value


def _in_caller_loop(fn: Callable[..., Any], bridge: AsyncioBridge) -> Callable[..., Any]:
    """A function stage for the trio side: ``fn`` is called there, and a coroutine it returns
    is awaited as a task of the caller's asyncio loop."""

    @functools.wraps(fn)
    def stage(*args: Any) -> Any:
        result = fn(*args)
        return bridge.in_caller_loop(result) if inspect.isawaitable(result) else result

    return stage


def asyncio_stages(calls: Sequence[Any]) -> tuple[list[Any], AsyncioBridge | None]:
    """A pipeline's stage calls for the trio side, and the bridge they run behind: each model
    loaded under asyncio becomes its trio-side network, each function stage runs as
    ``_in_caller_loop`` says. ``(calls, None)`` when no model was loaded under asyncio;
    ArgumentError when models of several runtimes (or of trio and asyncio) are mixed."""
    models = [c.stage for c in calls if isinstance(c.stage, LoadedNetwork)]
    bridges = {id(m._bridge): m._bridge for m in models if isinstance(m, AioLoadedNetwork)}
    if not bridges:
        return list(calls), None
    under_trio = sum(not isinstance(m, AioLoadedNetwork) for m in models)
    if len(bridges) > 1 or under_trio:
        raise ArgumentError(
            "Pipeline: stages must be models loaded by one runtime (a runtime entered under asyncio "
            f"runs in a trio thread of its own), got models of {len(bridges)} runtimes entered under "
            f"asyncio and {under_trio} loaded under trio"
        )
    (bridge,) = bridges.values()

    def trio_stage(stage: Any) -> Any:
        return trio_side(stage) if isinstance(stage, LoadedNetwork) else _in_caller_loop(stage, bridge)

    return [attrs.evolve(c, stage=trio_stage(c.stage)) for c in calls], bridge
