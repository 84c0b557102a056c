"""HIGH has the cores: while a HIGH job runs, jobs of lower priority pause at their next
workload boundary (for at most the aging bound), and HIGH jobs share the cores only among
themselves. Checked on the pool with fake jobs, then through the public API with profiled
runs of a LOW stream and HIGH requests."""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable

import numba
import numpy as np
import trio
import trio.testing
from gatedjobs import GatedJobs

import flowrt
from flowrt.profiling import ProfileRecord
from flowrt.types import Priority, TensorInfo
from flowrt.workers.cpu.worker_thread import share_cores
from flowrt.workers.cpu.workers import CpuWorkerPool


def stepped(jobs: GatedJobs, steps: list[str], began: dict[str, float]) -> Callable[[], None]:
    """A job of several workloads: ``share_cores`` before each (as the executor calls it), then
    the step's gated fake workload; ``began`` gets the clock as each step starts."""

    def run() -> None:
        for name in steps:
            share_cores()
            began[name] = time.monotonic()
            jobs.job(name)()

    return run


async def real_sleep(seconds: float) -> None:
    """Let the worker threads run for ``seconds`` of the real clock."""
    await trio.to_thread.run_sync(time.sleep, seconds)


async def test_a_lower_job_pauses_at_its_next_workload_while_a_high_job_runs():
    async with CpuWorkerPool(1) as pool:
        jobs = GatedJobs()
        began: dict[str, float] = {}
        async with trio.open_nursery() as nursery:
            low = stepped(jobs, ["low-1", "low-2"], began)
            nursery.start_soon(functools.partial(pool.run_sync, low, priority=Priority.LOW))
            await jobs.wait_started(1)
            nursery.start_soon(jobs.run, pool, "high", Priority.HIGH)  # on the reserve worker
            await jobs.wait_started(2)
            jobs.release("low-1")
            await real_sleep(0.2)
            assert jobs.order == ["low-1", "high"]  # paused, not on to its next workload
            ended = time.monotonic()
            jobs.release("high")
            await jobs.wait_started(3)
            jobs.release_all()
    assert jobs.order == ["low-1", "high", "low-2"]
    assert began["low-2"] >= ended


async def test_a_paused_job_whose_caller_is_cancelled_goes_on_at_once():
    # As the executor does: cancelling the call sets the run's stop flag (on_cancel), which
    # the job reads after each pause; it must not wait out the HIGH job first.
    async with CpuWorkerPool(1) as pool:
        jobs = GatedJobs()
        stop = threading.Event()
        steps: list[str] = []

        def low() -> None:
            for name in ("low-1", "low-2"):
                share_cores()
                if stop.is_set():
                    return
                steps.append(name)
                jobs.job(name)()

        scope = trio.CancelScope()

        async def call_low() -> None:
            with scope:
                await pool.run_sync(low, priority=Priority.LOW, on_cancel=stop.set)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(call_low)
            await jobs.wait_started(1)
            nursery.start_soon(jobs.run, pool, "high", Priority.HIGH)  # on the reserve worker
            await jobs.wait_started(2)
            jobs.release("low-1")
            await real_sleep(0.2)  # LOW pauses before its second workload
            began = time.monotonic()
            scope.cancel()
            while pool.idle_count == 0:  # until the LOW job has given its worker back
                await trio.sleep(0.001)
            ended = time.monotonic()
            assert (jobs.order, steps) == (["low-1", "high"], ["low-1"])  # "high" runs on; no "low-2"
            jobs.release_all()
    assert ended - began < 0.5  # not the 2 s a LOW job may pause for


async def test_a_lower_job_pauses_for_at_most_the_aging_interval_per_level():
    aging = 0.05
    async with CpuWorkerPool(1, aging_interval=aging) as pool:
        jobs = GatedJobs()
        for priority, levels in [(Priority.LOW, 2), (Priority.NORMAL, 1)]:
            began: dict[str, float] = {}
            steps = [f"{priority.name}-{i}" for i in range(3)]
            async with trio.open_nursery() as nursery:
                nursery.start_soon(
                    functools.partial(pool.run_sync, stepped(jobs, steps, began), priority=priority)
                )
                await jobs.wait_started(len(jobs.order) + 1)
                nursery.start_soon(jobs.run, pool, f"high-{priority.name}", Priority.HIGH)
                await jobs.wait_started(len(jobs.order) + 1)
                released = time.monotonic()
                jobs.release(steps[0])
                # HIGH runs on: the job goes on once its pause is spent, and pauses no more.
                await jobs.wait_started(len(jobs.order) + 1)
                jobs.release(steps[1])
                await jobs.wait_started(len(jobs.order) + 1)
                jobs.release_all()
            paused = began[steps[1]] - released
            assert levels * aging * 0.9 <= paused < levels * aging + 1.0, priority
            assert began[steps[2]] - began[steps[1]] < levels * aging, priority


async def test_time_spent_waiting_for_a_worker_counts_against_the_pause():
    aging = 0.5
    async with CpuWorkerPool(1, aging_interval=aging) as pool:
        jobs = GatedJobs()
        began: dict[str, float] = {}
        async with trio.open_nursery() as nursery:
            nursery.start_soon(jobs.run, pool, "normal", Priority.NORMAL)
            await jobs.wait_started(1)
            nursery.start_soon(jobs.run, pool, "high", Priority.HIGH)  # on the reserve worker
            await jobs.wait_started(2)
            low = stepped(jobs, ["low-0"], began)
            nursery.start_soon(functools.partial(pool.run_sync, low, priority=Priority.LOW))
            await real_sleep(2 * aging)  # LOW's whole bound, waiting for the worker
            released = time.monotonic()
            jobs.release("normal")
            # HIGH still runs, and LOW starts all the same: it may not pause any more.
            await jobs.wait_started(3)
            assert jobs.order == ["normal", "high", "low-0"]
            jobs.release_all()
    assert began["low-0"] - released < aging  # unpaused (a pause would last 2 * aging)


async def test_a_high_job_beside_lower_work_takes_every_thread_and_shares_them_with_high_jobs():
    async with CpuWorkerPool(2) as pool:
        jobs = GatedJobs()
        threads: dict[str, int] = {}

        def observe(name: str) -> Callable[[], None]:
            job = jobs.job(name)

            def run() -> None:
                threads[name] = numba.get_num_threads()
                job()

            return run

        async with trio.open_nursery() as nursery:
            for name, priority in [("low", Priority.LOW), ("high", Priority.HIGH)]:
                nursery.start_soon(functools.partial(pool.run_sync, observe(name), priority=priority))
                await jobs.wait_started(len(jobs.order) + 1)
            jobs.release_all()
        async with trio.open_nursery() as nursery:
            for name in ("high-a", "high-b"):
                nursery.start_soon(functools.partial(pool.run_sync, observe(name), priority=Priority.HIGH))
                await jobs.wait_started(len(jobs.order) + 1)
            jobs.release_all()
    half = max(1, pool.threads // 2)
    # The LOW job started alone; the first HIGH job took a regular worker with every thread.
    assert threads == {"low": pool.threads, "high": pool.threads, "high-a": pool.threads, "high-b": half}


def tanh_chain(layers: int) -> flowrt.Network:
    """A chain of ``layers`` Tanh layers on a (1, 512, 512) input: one workload per layer."""
    net = flowrt.Network()
    x = net.add_input("x", TensorInfo((1, 512, 512)))
    for i in range(layers):
        x = net.add_layer("Tanh", inputs=[x], name=f"tanh{i}")
    net.add_output("y", x)
    return net


async def test_no_low_workload_starts_while_a_high_run_runs_beside_a_low_stream():
    opt = flowrt.optimize(tanh_chain(12), backends=["CpuRef"])
    x = np.linspace(-1, 1, 512 * 512, dtype=np.float32).reshape(1, 512, 512)
    async with flowrt.Runtime(cpu_workers=2, profiling=True) as rt:
        low, high = await rt.load(opt), await rt.load(opt)
        low_done = 0
        async with low.stream(max_in_flight=4, priority=Priority.LOW) as s:
            async with trio.open_nursery() as nursery:

                async def saturate() -> None:
                    while True:
                        await s.send({"x": x})

                async def drain() -> None:
                    nonlocal low_done
                    async for outputs in s:
                        np.testing.assert_allclose(outputs["y"], high_result, rtol=1e-6)
                        low_done += 1

                high_result = (await high.run({"x": x}))["y"]
                high.profile(clear=True)
                nursery.start_soon(saturate)
                nursery.start_soon(drain)
                for _ in range(5):
                    while low_done < 1 or rt._workers.idle_count:  # type: ignore[union-attr]
                        await trio.sleep(0.002)  # until LOW work fills both workers
                    outputs = await high.run({"x": x}, priority=Priority.HIGH)
                    np.testing.assert_array_equal(outputs["y"], high_result)
                nursery.cancel_scope.cancel()
    high_runs: dict[int, list[ProfileRecord]] = {}
    for record in high.profile():
        high_runs.setdefault(record.run, []).append(record)
    low_starts = np.array([record.start_ns for record in low.profile()])
    assert len(high_runs) == 5 and len(low_starts) > 12
    for records in high_runs.values():
        assert len(records) == 12
        first, last = min(r.start_ns for r in records), max(r.end_ns for r in records)
        # At most the workload each LOW worker had begun as the HIGH run started; unpaused,
        # LOW workloads would start all through the HIGH run's 12.
        assert np.count_nonzero((low_starts > first) & (low_starts < last)) <= 2
