"""The models a server holds: Triton's repository layout, and one served model's queue.

A repository is a directory with one directory per model, one numbered directory per
version in it, and the model file there (``model.onnx`` or ``model.flowrt``, or the config's
``default_model_filename``); the model's ``config.pbtxt`` beside its versions. The highest
version is served.

A served model is loaded once in the server's runtime (``instance_group`` counts: its memory
pools). Every client's requests go through one stream per priority level, so that requests
from different clients share a batch where ``dynamic_batching`` is on (``max_batch``, and
``max_queue_delay_microseconds`` as the batching delay). Admission follows the queue policy:
a request that finds ``max_queue_size`` requests waiting is refused at once
(:class:`QueueFull`), one that has not started within its timeout is rejected, not run
(:class:`QueueTimeout`).
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import trio

from flowrt.errors import InputError, ResourceError, ShapeError
from flowrt.serve import config as configs
from flowrt.stream import request_rows
from flowrt.types import Priority

MODEL_FILES = ("model.onnx", "model.flowrt")


class NotFound(InputError):
    """An unknown model, version or route (HTTP 404)."""


class QueueFull(ResourceError):
    """The model's queue holds ``max_queue_size`` requests already."""


class QueueTimeout(ResourceError):
    """A request waited past its timeout without starting: rejected, not run."""


def first_error(group: BaseExceptionGroup) -> BaseException:
    """The first error inside ``group`` (a nursery's), nested groups opened: what a request
    answers with when one of its parts failed."""
    first = group.exceptions[0]
    while isinstance(first, BaseExceptionGroup):
        first = first.exceptions[0]
    return first


def model_directories(repository: Path) -> list[Path]:
    """The model directories of ``repository``, by name."""
    return sorted(p for p in repository.iterdir() if p.is_dir() and not p.name.startswith("."))


def versions(directory: Path) -> list[int]:
    """The version directories of a model, in increasing order."""
    return sorted(int(p.name) for p in directory.iterdir() if p.is_dir() and p.name.isdigit())


def model_file(directory: Path, config: configs.ModelConfig) -> tuple[int, Path]:
    """(version, file) of the model to serve from ``directory``: its highest version."""
    found = versions(directory)
    if not found:
        raise InputError(f"model {directory.name!r}: no version directory (1/, 2/...) in {directory}")
    version = found[-1]
    names = (config.default_model_filename,) if config.default_model_filename else MODEL_FILES
    for name in names:
        path = directory / str(version) / name
        if path.is_file():
            return version, path
    raise InputError(
        f"model {directory.name!r} version {version}: none of {', '.join(names)} in {path.parent}"
    )


def open_model(path: Path, backends: str | None) -> Any:
    """The optimized network of a model file: a .flowrt file as it was converted (``backends``
    must then be its own or None), an ONNX model optimized for ``backends`` (a comma-separated
    preference list; default: the fastest available)."""
    import flowrt
    from flowrt import defaults, serialize

    chosen = None if backends is None else [b.strip() for b in backends.split(",") if b.strip()]
    if serialize.is_flowrt_file(path):
        opt = serialize.load(path)
        if chosen is not None and chosen != list(opt.backends):
            raise InputError(
                f"{path} was converted for backends {','.join(opt.backends)}, the config asks for {backends}"
            )
        return opt
    return flowrt.optimize(flowrt.onnx.load(path), backends=chosen or defaults.default_backends())


def priority_of(level: int, levels: int) -> Priority:
    """Triton's priority level (1 the highest of ``levels``; 0: the default) as flowrt's."""
    if level <= 0 or levels <= 1:
        return Priority.MEDIUM
    third = (level - 1) * 3 // levels
    return (Priority.HIGH, Priority.MEDIUM, Priority.LOW)[min(third, 2)]


class ServedModel:
    """One loaded model and its request queue; made by the server, used by its handlers."""

    def __init__(
        self, name: str, version: int, config: configs.ModelConfig, model: Any, nursery: trio.Nursery
    ) -> None:
        self.name, self.version, self.config, self.model = name, version, config, model
        self._nursery = nursery
        self._streams: dict[Priority, Any] = {}
        self._opening: dict[Priority, trio.Event] = {}
        self.closed = trio.Event()
        self.inputs, self.outputs = model.inputs, model.outputs
        self.rows = self._rows()
        # requests started at once: as many as the stream holds (a batch per pool running and
        # one forming per pool where it batches)
        self.capacity = (
            2 * model.pools.count * config.max_batch if config.max_batch > 1 else model.pools.count
        )
        self._admitted = trio.Semaphore(self.capacity)
        self.waiting = 0  # requests not started yet

    def _rows(self) -> int | None:
        """The leading dim of every input when the model batches (max_batch_size > 0)."""
        if self.config.max_batch_size <= 0:
            return None
        try:
            return request_rows(self.model.inputs)
        except ShapeError as e:
            raise InputError(
                f"model {self.name!r}: max_batch_size {self.config.max_batch_size}: {e}"
            ) from None

    async def _stream(self, priority: Priority) -> Any:
        """The stream of ``priority``, opened on first use and kept until the model closes."""
        while priority not in self._streams:
            opening = self._opening.get(priority)
            if opening is not None:
                await opening.wait()
                continue
            self._opening[priority] = trio.Event()
            try:
                self._streams[priority] = await self._nursery.start(self._hold_stream, priority)
            finally:
                self._opening.pop(priority).set()
        return self._streams[priority]

    async def _hold_stream(self, priority: Priority, task_status=trio.TASK_STATUS_IGNORED) -> None:
        config = self.config
        if config.max_batch > 1:
            stream = self.model.stream(
                priority=priority, max_batch=config.max_batch, max_delay=config.max_queue_delay,
                max_in_flight=self.capacity,
            )  # fmt: skip
        else:
            stream = self.model.stream(priority=priority, max_in_flight=self.capacity)
        async with stream:
            task_status.started(stream)
            await self.closed.wait()

    def pools(self) -> tuple[int, int]:
        """(free, all) memory pools of the model and of its batch-size variants."""
        loaded = [self.model, *self.model.batched_models.values()]
        return sum(m.pools.free_count for m in loaded), sum(m.pools.count for m in loaded)

    def batch_counts(self) -> dict[int, int]:
        """How many batches of each number of requests its streams have run (none unbatched)."""
        counts: dict[int, int] = {}
        for stream in self._streams.values():
            for size, count in getattr(stream, "batch_counts", {}).items():
                counts[size] = counts.get(size, 0) + count
        return counts

    def close(self) -> None:
        """Close its streams (requests in them finish first)."""
        self.closed.set()

    async def infer(
        self, feeds: Mapping[str, np.ndarray], priority: Priority, timeout: float | None
    ) -> tuple[dict[str, np.ndarray], float]:
        """The outputs of one request, and the seconds it waited before it started. A request
        of k rows (k <= max_batch_size) on a model that batches runs as k requests of the
        model's own rows, which the stream batches with everyone else's."""
        queue = self.config.queue
        if queue.max_queue_size and self.waiting >= queue.max_queue_size:
            raise QueueFull(
                f"model {self.name!r}: its queue holds {queue.max_queue_size} requests (max_queue_size)"
            )
        parts = self._split(feeds)
        stream = await self._stream(priority)
        arrived = time.perf_counter()
        self.waiting += 1
        try:
            with trio.move_on_after(math.inf if timeout is None else timeout) as waited:
                await self._admitted.acquire()
        finally:
            self.waiting -= 1
        if waited.cancelled_caught:
            raise QueueTimeout(
                f"model {self.name!r}: the request waited {timeout:g} s without starting (timeout)"
            )
        queued = time.perf_counter() - arrived
        try:
            if len(parts) == 1:
                return await stream.submit(parts[0]), queued
            results: list[Any] = [None] * len(parts)

            async def one(i: int) -> None:
                results[i] = await stream.submit(parts[i])

            try:
                async with trio.open_nursery() as nursery:
                    for i in range(len(parts)):
                        nursery.start_soon(one, i)
            except BaseExceptionGroup as group:
                raise first_error(group) from None
        finally:
            self._admitted.release()
        return {name: np.concatenate([r[name] for r in results]) for name in results[0]}, queued

    def _split(self, feeds: Mapping[str, np.ndarray]) -> list[Mapping[str, np.ndarray]]:
        """``feeds`` as requests of the model's own rows, where it batches."""
        rows = self.rows
        if rows is None:
            return [feeds]
        leading = {np.shape(v)[0] if np.ndim(v) else None for v in feeds.values()}
        count = next(iter(leading), None)
        if len(leading) != 1 or not isinstance(count, int) or count < 1 or count % rows:
            raise InputError(
                f"model {self.name!r}: every input needs the same leading (batch) dim, a multiple of {rows}; "
                f"got {', '.join(f'{n} {np.shape(v)}' for n, v in feeds.items())}"
            )
        if count // rows > self.config.max_batch_size:
            raise InputError(
                f"model {self.name!r}: a batch of {count // rows} is over its max_batch_size, {self.config.max_batch_size}"
            )
        return [{n: v[i : i + rows] for n, v in feeds.items()} for i in range(0, count, rows)]
