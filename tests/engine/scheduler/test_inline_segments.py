"""A quick host segment of the CPU backends runs on the executor's thread, once its pool has
its program: no trip to a worker thread and back (see ``executor.INLINE_S``)."""

from __future__ import annotations

import numpy as np
import pytest
import trio

import flowrt
from flowrt.engine.scheduler import executor
from flowrt.types import TensorInfo
from flowrt.workers.cpu.workers import CpuWorkerPool

BACKENDS = (["CpuAcc", "CpuRef"], ["CpuRef"])


def _network(batch: int | str = 2) -> flowrt.Network:
    """x -> Relu -> Add(1) -> Sigmoid -> y on (batch, 16): microseconds of work."""
    net = flowrt.Network()
    x = net.add_input("x", TensorInfo((batch, 16)))
    relu = net.add_layer("Relu", inputs=[x], name="relu")
    one = net.add_layer("Add", inputs=[relu, np.ones((1, 16), np.float32)], name="add")
    net.add_output("y", net.add_layer("Sigmoid", inputs=[one], name="sigmoid"))
    return net


def _expected(x: np.ndarray) -> np.ndarray:
    return 1 / (1 + np.exp(-(np.maximum(x, 0) + 1)))


@pytest.fixture(autouse=True)
def generous_bound(monkeypatch) -> None:
    """A bound no run of these networks misses on a loaded machine: the tests are about which
    runs go where, not about the bound's value."""
    monkeypatch.setattr(executor, "INLINE_S", 0.05)


@pytest.fixture
def handoffs(monkeypatch) -> list[int]:
    """The jobs handed to CPU worker threads, counted."""
    count: list[int] = []
    handed = CpuWorkerPool.run_sync

    async def counted(self, fn, *args, **kwargs):
        count.append(1)
        return await handed(self, fn, *args, **kwargs)

    monkeypatch.setattr(CpuWorkerPool, "run_sync", counted)
    return count


async def _runs(model: flowrt.LoadedNetwork, count: int, rng: np.random.Generator, **run) -> None:
    for _ in range(count):
        x = rng.standard_normal(model.inputs["x"].shape).astype(np.float32)
        out = await model.run({"x": x}, **run)
        np.testing.assert_allclose(out["y"], _expected(x), rtol=1e-6)


@pytest.mark.parametrize("backends", BACKENDS, ids=["+".join(b) for b in BACKENDS])
async def test_a_quick_network_runs_on_the_callers_thread_once_its_pool_has_its_program(backends, handoffs):
    rng = np.random.default_rng(0)
    async with flowrt.Runtime(cpu_workers=2) as rt:
        model = await rt.load(flowrt.optimize(_network(), backends=backends), max_in_flight=2)
        # Each pool: a first run, a second that makes its program and measures it.
        await _runs(model, 4, rng)
        before = len(handoffs)
        await _runs(model, 10, rng)
        assert len(handoffs) == before
        # a caller's output array is written all the same
        x = rng.standard_normal((2, 16)).astype(np.float32)
        y = np.empty((2, 16), np.float32)
        assert (await model.run({"x": x}, outputs={"y": y}))["y"] is y
        np.testing.assert_allclose(y, _expected(x), rtol=1e-6)
        assert len(handoffs) == before


async def test_runs_in_flight_at_once_run_on_the_callers_thread_one_after_another(handoffs):
    rng = np.random.default_rng(1)
    async with flowrt.Runtime(cpu_workers=2) as rt:
        model = await rt.load(flowrt.optimize(_network(), backends=["CpuAcc", "CpuRef"]), max_in_flight=2)
        for _phase in range(2):  # the first: until each pool has its program
            before = len(handoffs)
            async with trio.open_nursery() as nursery:
                for _ in range(8):
                    nursery.start_soon(_runs, model, 3, rng)
        assert len(handoffs) == before


async def test_a_profiled_run_a_slow_segment_and_dynamic_inputs_go_to_the_workers(handoffs, monkeypatch):
    rng = np.random.default_rng(2)
    async with flowrt.Runtime(cpu_workers=2) as rt:
        model = await rt.load(flowrt.optimize(_network(), backends=["CpuAcc", "CpuRef"]), max_in_flight=1)
        await _runs(model, 3, rng)
        before = len(handoffs)
        await _runs(model, 2, rng, profile=True)  # each workload timed on its worker
        assert len(handoffs) == before + 2
        assert {r.worker for r in model.profile()} <= {"flowrt-cpu-0", "flowrt-cpu-1"}
        # a segment slower than the bound goes back to the workers (and is measured there)
        with monkeypatch.context() as patched:
            patched.setattr(executor, "INLINE_S", 0.0)
            await _runs(model, 2, rng)
        assert len(handoffs) == before + 4
        await _runs(model, 2, rng)  # measured quick again
        assert len(handoffs) == before + 4
        # inputs whose dims may change: a new shape may compile kernels, off the caller's thread
        dynamic = await rt.load(
            flowrt.optimize(_network("N"), backends=["CpuAcc", "CpuRef"]), max_in_flight=1
        )
        before = len(handoffs)
        for batch in (2, 2, 2, 2, 3):
            x = rng.standard_normal((batch, 16)).astype(np.float32)
            np.testing.assert_allclose((await dynamic.run({"x": x}))["y"], _expected(x), rtol=1e-6)
        assert len(handoffs) == before + 5


async def test_a_cancelled_caller_gets_no_result_from_a_run_on_its_thread():
    rng = np.random.default_rng(3)
    async with flowrt.Runtime(cpu_workers=1) as rt:
        model = await rt.load(flowrt.optimize(_network(), backends=["CpuAcc", "CpuRef"]), max_in_flight=1)
        await _runs(model, 3, rng)
        x = rng.standard_normal((2, 16)).astype(np.float32)
        with trio.CancelScope() as scope:
            scope.cancel()
            await model.run({"x": x})
        assert scope.cancelled_caught
        # the pool came back: the next run gets it
        np.testing.assert_allclose((await model.run({"x": x}))["y"], _expected(x), rtol=1e-6)


class _Segment:
    index = 0


class _Pool:
    programs = {0: "its program"}


@pytest.mark.parametrize(
    ("worker", "inline", "quick"),
    [
        (0.5e-4, None, True),  # quick on the workers: tried on the caller's thread
        (1.5e-4, None, False),
        (0.5e-4, 1.5e-4, True),  # slower on one thread, but less than the trip it saves
        (0.5e-4, 2.5e-4, False),  # too slow there: back to the workers
        (None, 0.5e-4, True),
    ],
)
def test_a_segment_on_the_callers_thread_stays_there_while_under_twice_the_bound(
    worker, inline, quick, monkeypatch
):
    monkeypatch.setattr(executor, "INLINE_S", 1e-4)  # the bound itself, not the fixture's
    costs = {} if worker is None else {0: worker}
    inline_costs = {} if inline is None else {0: inline}
    assert executor._quick(_Segment(), costs, inline_costs, _Pool()) is quick
    assert executor._quick(_Segment(), costs, inline_costs, None) is False
