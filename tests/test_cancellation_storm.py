"""A cancellation storm: many concurrent runs, streams, batching streams and pipelines, and the
``async with flowrt.Runtime()`` block around them, cancelled at random points, round after
round (seeded: each client's choices come from a generator of its own).

Clients are cancelled by ``trio.move_on_after`` with a small random real delay, or by a task
that cancels their scope after a random number of checkpoints, or not at all (their results
are then checked); some run outside the runtime's block, so that the runtime closes under
them. After each round: no trio internal error (each round is a task of its own, whose
corrupted nursery stack would fail it), nothing but ``trio.Cancelled`` (caught by its scope)
or a ``flowrt.errors`` error left any client, every memory pool is back with its manager, no
flowrt thread outlives the runtime; after the storm a fresh runtime runs right.

About 200 cancellations in CI; ``-m slow`` runs 5,000.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Awaitable

import numpy as np
import pytest
import trio
from netbuild import branchy_expected, branchy_network

import flowrt
from flowrt.engine.memory.pool import PoolManager
from flowrt.errors import FlowrtError
from flowrt.stream import batch_sizes

SEED = 32
CI_CANCELLATIONS = 200
SLOW_CANCELLATIONS = 5_000
KINDS = ["run", "run", "submit", "stream", "batching", "pipeline", "pipeline_run"]


def _flowrt_threads() -> set[threading.Thread]:
    return {t for t in threading.enumerate() if t.name.startswith("flowrt")}


def _feeds(rng: random.Random) -> dict[str, np.ndarray]:
    return {"x": np.array([[rng.uniform(-3, 3) for _ in range(4)]], np.float32)}


def _check(feeds: dict[str, np.ndarray], outputs: dict[str, np.ndarray], twice: bool = False) -> None:
    expected = branchy_expected(feeds["x"])
    if twice:
        expected = branchy_expected(expected)
    np.testing.assert_allclose(outputs["y"], expected, rtol=1e-5, atol=1e-6)


class Storm:
    """What one round's clients share: the models, and what happened to them."""

    def __init__(self, model: flowrt.LoadedNetwork, helpers: trio.Nursery) -> None:
        self.model = model
        self.pipeline = flowrt.Pipeline([model, lambda out: {"x": out["y"]}, model])
        self.helpers = helpers  # where cancellers run
        self.cancellations = 0
        self.flowrt_errors = 0
        self.finished = 0

    async def client(self, rng: random.Random) -> None:
        """One client's work under one random cancellation; a FlowrtError (the network was
        unloaded, the stream closed, the workers stopped under it) is allowed, nothing else."""
        work = getattr(self, f"_{rng.choice(KINDS)}")
        scope = trio.CancelScope()
        how = rng.random()
        if how < 0.4:
            scope.deadline = trio.current_time() + rng.uniform(0, 0.004)
        elif how < 0.8:
            self.helpers.start_soon(_cancel_after, scope, rng.randrange(40))
        try:
            with scope:
                await work(rng)
                self.finished += 1
        except* FlowrtError:  # grouped when it came through this test's own nurseries
            self.flowrt_errors += 1
        self.cancellations += scope.cancelled_caught

    async def _run(self, rng: random.Random) -> None:
        feeds = _feeds(rng)
        _check(feeds, await self.model.run(feeds))

    async def _pipeline_run(self, rng: random.Random) -> None:
        feeds = _feeds(rng)
        _check(feeds, await self.pipeline.run(feeds), twice=True)

    async def _submit(self, rng: random.Random) -> None:
        async with self.model.stream(max_in_flight=rng.randint(1, 3)) as stream:
            async with trio.open_nursery() as nursery:
                for _ in range(rng.randint(1, 4)):
                    nursery.start_soon(self._submit_one, stream, _feeds(rng))

    @staticmethod
    async def _submit_one(stream, feeds) -> None:
        _check(feeds, await stream.submit(feeds))

    async def _stream(self, rng: random.Random) -> None:
        await _through(self.model.stream(max_in_flight=rng.randint(1, 3)), rng, twice=False)

    async def _batching(self, rng: random.Random) -> None:
        stream = self.model.stream(max_batch=rng.choice([2, 3]), max_delay=rng.uniform(0, 0.002))
        await _through(stream, rng, twice=False)

    async def _pipeline(self, rng: random.Random) -> None:
        await _through(self.pipeline.stream(max_in_flight=rng.randint(1, 4)), rng, twice=True)


async def _through(stream, rng: random.Random, twice: bool) -> None:
    """Send a few requests from a task of their own and receive them, in order, checked."""
    sent = [_feeds(rng) for _ in range(rng.randint(1, 5))]

    async def send(s) -> None:
        for feeds in sent:
            await s.send(feeds)
        s.close()

    async with stream as s:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(send, s)
            received = 0
            async for outputs in s:
                _check(sent[received], outputs, twice)
                received += 1
    assert received == len(sent)


async def _cancel_after(scope: trio.CancelScope, checkpoints: int) -> None:
    for _ in range(checkpoints):
        await trio.sleep(0)
    scope.cancel()


async def _round(optimized: flowrt.OptimizedNetwork, seed: int) -> tuple[int, int]:
    """One storm round; (cancellations, clients that finished)."""
    rng = random.Random(seed)
    before = _flowrt_threads()
    managers: list[PoolManager] = []
    storm: Storm | None = None
    block = trio.CancelScope()
    with trio.fail_after(60):
        async with trio.open_nursery() as helpers:
            how = rng.random()
            if how < 0.35:
                block.deadline = trio.current_time() + rng.uniform(0, 0.03)
            elif how < 0.7:
                helpers.start_soon(_cancel_after, block, rng.randrange(200))
            with block:
                async with flowrt.Runtime(cpu_workers=rng.choice([1, 2])) as rt:
                    model = await rt.load(optimized, max_in_flight=rng.randint(1, 3), batch=1)
                    managers.append(model.pools)
                    for size in batch_sizes(3):  # the batching streams' models
                        managers.append((await model.batched(size)).pools)
                    storm = Storm(model, helpers)
                    async with trio.open_nursery() as inside:
                        for _ in range(rng.randint(4, 10)):
                            # Some outside the runtime's block: it closes under them.
                            where = helpers if rng.random() < 0.25 else inside
                            where.start_soon(storm.client, random.Random(rng.getrandbits(64)))
    assert all(m.free_count == m.count and m.waiting_count == 0 for m in managers), "a pool is still lent"
    _assert_threads_ended(before)
    cancelled = block.cancelled_caught + (storm.cancellations if storm else 0)
    return cancelled, storm.finished if storm else 0


def _assert_threads_ended(before: set[threading.Thread]) -> None:
    deadline = time.monotonic() + 2  # a short grace: the runtime joins its own before it ends
    while (left := _flowrt_threads() - before) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not left, f"flowrt threads still alive after the runtime ended: {sorted(t.name for t in left)}"


async def _storm(cancellations: int, seed: int) -> None:
    optimized = flowrt.optimize(branchy_network(), backends=["CpuRef"])
    done = finished = rounds = 0
    while done < cancellations:
        async with trio.open_nursery() as nursery:  # a corrupted nursery stack fails this round
            results: list[tuple[int, int]] = []
            nursery.start_soon(_collect, results, _round(optimized, seed * 100_003 + rounds))
        done, finished, rounds = done + results[0][0], finished + results[0][1], rounds + 1
    assert finished > 0  # not every client was cancelled: their outputs were checked
    async with flowrt.Runtime(cpu_workers=2) as rt:  # and a fresh runtime runs right
        model = await rt.load(optimized)
        x = np.linspace(-2, 2, 12, dtype=np.float32).reshape(3, 4)
        np.testing.assert_allclose((await model.run({"x": x}))["y"], branchy_expected(x), rtol=1e-6)


async def _collect(results: list, round_: Awaitable[tuple[int, int]]) -> None:
    results.append(await round_)


async def test_a_storm_of_cancellations_leaves_no_error_pool_or_thread_behind():
    await _storm(CI_CANCELLATIONS, SEED)


@pytest.mark.slow
async def test_5000_cancellations():
    await _storm(SLOW_CANCELLATIONS, SEED + 1)
