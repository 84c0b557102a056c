"""CpuWorkerPool: idle workers lent by priority, first come first served within one, with
aging; HIGH beside lower-priority work on a reserve worker; threads that follow the load;
cancellation never leaves a worker held."""

from __future__ import annotations

import functools
import os
import threading
import time
from collections.abc import Callable

import numba
import numpy as np
import pytest
import trio
import trio.testing
from gatedjobs import GatedJobs
from netbuild import branchy_network

import flowrt
from flowrt.errors import FlowrtError
from flowrt.types import Priority
from flowrt.workers.cpu.worker_thread import attend, job_context, job_signal, share_cores
from flowrt.workers.cpu.workers import LOW_PRIORITY_NICE, CpuWorkerPool, nice_is_reversible


async def test_run_sync_returns_the_result_or_raises_the_error_and_gives_the_worker_back():
    async with CpuWorkerPool(2) as pool:
        assert await pool.run_sync(sum, [1, 2, 3]) == 6
        with pytest.raises(ZeroDivisionError):
            await pool.run_sync(lambda: 1 / 0)
        assert pool.idle_count == 2
        names = await pool.run_sync(lambda: threading.current_thread().name)
        assert names.startswith("flowrt-cpu-")


async def test_run_sync_outside_the_pool_block_is_refused():
    pool = CpuWorkerPool(1)
    with pytest.raises(FlowrtError, match="not running"):
        await pool.run_sync(print)


async def test_waiting_calls_get_a_worker_by_priority_then_first_come(autojump_clock):
    async with CpuWorkerPool(1) as pool:
        jobs = GatedJobs()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(jobs.run, pool, "first", Priority.HIGH)
            await jobs.wait_started(1)
            for name, priority in [
                ("low", Priority.LOW),
                ("normal-1", Priority.NORMAL),
                ("high", Priority.HIGH),
                ("normal-2", Priority.NORMAL),
            ]:
                nursery.start_soon(jobs.run, pool, name, priority)
                await trio.testing.wait_all_tasks_blocked()
            assert (pool.idle_count, pool.waiting_count) == (0, 4)
            jobs.release_all()
    assert jobs.order == ["first", "high", "normal-1", "normal-2", "low"]
    assert pool.idle_count == 1


async def test_the_first_worker_given_back_goes_to_the_highest_priority_waiter(autojump_clock):
    async with CpuWorkerPool(2) as pool:
        jobs = GatedJobs()
        async with trio.open_nursery() as nursery:
            for name in ("low-a", "low-b"):
                nursery.start_soon(jobs.run, pool, name, Priority.LOW)
            await jobs.wait_started(2)
            nursery.start_soon(jobs.run, pool, "low-c", Priority.LOW)
            await trio.testing.wait_all_tasks_blocked()
            nursery.start_soon(jobs.run, pool, "normal", Priority.NORMAL)
            await trio.testing.wait_all_tasks_blocked()
            jobs.release("low-b")
            await jobs.wait_started(3)
            assert jobs.order[2] == "normal"
            jobs.release_all()
    assert jobs.order[3] == "low-c"


async def test_high_runs_at_once_on_a_reserve_worker_beside_lower_priority_work(autojump_clock):
    async with CpuWorkerPool(1) as pool:
        jobs = GatedJobs()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(jobs.run, pool, "low", Priority.LOW)
            await jobs.wait_started(1)
            nursery.start_soon(jobs.run, pool, "normal", Priority.NORMAL)
            await trio.testing.wait_all_tasks_blocked()
            nursery.start_soon(jobs.run, pool, "high-1", Priority.HIGH)
            await jobs.wait_started(2)  # "low" still holds the only worker
            assert jobs.order == ["low", "high-1"]
            # The reserve is busy, and so is the worker: the next HIGH call waits, first in line.
            nursery.start_soon(jobs.run, pool, "high-2", Priority.HIGH)
            await trio.testing.wait_all_tasks_blocked()
            assert pool.waiting_count == 2
            jobs.release("low")
            await jobs.wait_started(3)
            assert jobs.order[2] == "high-2"
            jobs.release_all()
    assert jobs.order == ["low", "high-1", "high-2", "normal"]


async def test_a_high_call_never_waits_for_a_low_job_that_took_the_last_idle_worker_beside_it(autojump_clock):
    # A HIGH and a LOW call arrive in one step of trio, with one worker idle: whichever takes
    # it, the HIGH call starts at once (on the reserve if LOW won). trio runs the tasks of a
    # step in an order of its own choosing: the case is tried several times.
    async with CpuWorkerPool(2) as pool:
        for attempt in range(12):
            jobs = GatedJobs()
            async with trio.open_nursery() as nursery:
                nursery.start_soon(jobs.run, pool, "low-running", Priority.LOW)
                await jobs.wait_started(1)
                nursery.start_soon(jobs.run, pool, "high", Priority.HIGH)
                nursery.start_soon(jobs.run, pool, "low-new", Priority.LOW)
                assert await jobs.wait_started_within("high", seconds=5.0), (attempt, jobs.order)
                jobs.release_all()


async def test_high_waits_in_line_when_only_high_work_runs(autojump_clock):
    async with CpuWorkerPool(1) as pool:
        jobs = GatedJobs()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(jobs.run, pool, "high-1", Priority.HIGH)
            await jobs.wait_started(1)
            nursery.start_soon(jobs.run, pool, "high-2", Priority.HIGH)
            await trio.testing.wait_all_tasks_blocked()
            assert (jobs.order, pool.waiting_count) == (["high-1"], 1)
            jobs.release_all()
    assert jobs.order == ["high-1", "high-2"]


async def test_a_waiting_low_priority_call_ages_and_is_not_starved(autojump_clock):
    async with CpuWorkerPool(1, aging_interval=1.0) as pool:
        jobs = GatedJobs()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(jobs.run, pool, "first", Priority.NORMAL)
            await jobs.wait_started(1)
            nursery.start_soon(jobs.run, pool, "low", Priority.LOW)
            await trio.testing.wait_all_tasks_blocked()
            # A NORMAL call arrives every 0.5 s and each job holds the only worker for 0.5 s:
            # without aging the LOW call would wait for ever.
            for i in range(6):
                nursery.start_soon(jobs.run, pool, f"normal{i}", Priority.NORMAL)
                await trio.testing.wait_all_tasks_blocked()
                await trio.sleep(0.5)
                jobs.release(jobs.order[-1])
                await jobs.wait_started(i + 2)
            jobs.release_all()
    # After one interval LOW competes as NORMAL and, having waited longest, goes first.
    assert jobs.order[:3] == ["first", "normal0", "low"]
    assert dict(jobs.started)["low"] == pytest.approx(1.0)


async def test_the_next_waiting_job_is_on_the_worker_before_the_finished_call_returns():
    # A stream's next batch must not wait for trio to run its task before its job reaches
    # the worker: the worker is lent, and the job started, as the previous job is delivered.
    async with CpuWorkerPool(1) as pool:
        started = threading.Event()
        gate = threading.Event()
        async with trio.open_nursery() as nursery:

            async def first() -> None:
                await pool.run_sync(gate.wait, 30)
                # No checkpoint since the call returned: the waiting task has not run again.
                assert started.wait(timeout=5)

            nursery.start_soon(first)
            await trio.testing.wait_all_tasks_blocked()
            nursery.start_soon(pool.run_sync, started.set)
            await trio.testing.wait_all_tasks_blocked()
            assert pool.waiting_count == 1
            gate.set()
        assert pool.idle_count == 1


async def test_a_cancelled_waiter_never_holds_a_worker(autojump_clock):
    async with CpuWorkerPool(1) as pool:
        jobs = GatedJobs()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(jobs.run, pool, "first")
            await jobs.wait_started(1)
            with trio.move_on_after(1.0) as scope:
                await jobs.run(pool, "cancelled", Priority.NORMAL)
            assert scope.cancelled_caught
            assert (pool.idle_count, pool.waiting_count) == (0, 0)
            nursery.start_soon(jobs.run, pool, "next")
            await trio.testing.wait_all_tasks_blocked()
            jobs.release_all()
        assert jobs.order == ["first", "next"]
        assert pool.idle_count == 1
        assert await pool.run_sync(int, "7") == 7


async def test_a_started_job_is_waited_for_when_its_caller_is_cancelled(autojump_clock):
    async with CpuWorkerPool(1) as pool:
        jobs = GatedJobs()
        ended: list[float] = []

        async def release_later() -> None:
            await trio.sleep(2.0)
            jobs.release("slow")

        async with trio.open_nursery() as nursery:
            nursery.start_soon(release_later)
            with trio.move_on_after(1.0):
                await jobs.run(pool, "slow")
                ended.append(trio.current_time())
        assert ended == [pytest.approx(2.0)]
        assert pool.idle_count == 1


async def test_model_runs_pass_their_priority_to_the_workers():
    opt = flowrt.optimize(branchy_network(), backends=["CpuRef"])
    x = np.ones((2, 4), np.float32)
    finished: list[str] = []
    async with flowrt.Runtime(cpu_workers=1) as rt:
        model = await rt.load(opt, max_in_flight=3)
        gate = threading.Event()

        async def run(name: str, priority: Priority) -> None:
            await model.run({"x": x}, priority=priority)
            finished.append(name)

        async with trio.open_nursery() as nursery:
            # Another model's segment would hold the only worker the same way.
            nursery.start_soon(functools.partial(rt._workers.run_sync, gate.wait, 30))  # type: ignore[union-attr]
            await trio.testing.wait_all_tasks_blocked()
            for name, priority in [("low", Priority.LOW), ("normal", Priority.NORMAL)]:
                nursery.start_soon(run, name, priority)
                await trio.testing.wait_all_tasks_blocked()
            assert rt._workers.waiting_count == 2  # type: ignore[union-attr]
            await run("high", Priority.HIGH)  # on a reserve worker, while the gate is shut
            gate.set()
    assert finished == ["high", "normal", "low"]


async def test_runs_in_flight_together_share_the_cores_instead_of_oversubscribing(autojump_clock):
    async with CpuWorkerPool(2) as pool:
        jobs = GatedJobs()
        seen: dict[str, tuple[int, int]] = {}

        def observe(name: str) -> Callable[[], None]:
            job = jobs.job(name)

            def run() -> None:
                thread = threading.get_native_id()
                seen[name] = (numba.get_num_threads(), os.getpriority(os.PRIO_PROCESS, thread))
                job()

            return run

        base = os.getpriority(os.PRIO_PROCESS, 0)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(functools.partial(pool.run_sync, observe("alone"), priority=Priority.LOW))
            await jobs.wait_started(1)
            nursery.start_soon(functools.partial(pool.run_sync, observe("beside"), priority=Priority.LOW))
            await jobs.wait_started(2)
            jobs.release_all()
        assert await pool.run_sync(numba.get_num_threads) == pool.threads
    # A LOW job on one thread steps back for the others, where the OS lets it step up again.
    low_nice = min(base + LOW_PRIORITY_NICE, 19) if nice_is_reversible() else base

    def expected(threads: int) -> tuple[int, int]:
        return threads, low_nice if threads == 1 else base

    assert seen == {"alone": expected(pool.threads), "beside": expected(max(1, pool.threads // 2))}


async def test_a_job_that_started_alone_steps_down_when_another_starts_beside_it(autojump_clock):
    """Between its workloads (``share_cores``) a job takes its share of the cores now: the
    cores of both while alone, one once a second job runs, and not both again in that job;
    the context it returns (what the kernels split their windows by) says as much."""
    async with CpuWorkerPool(2) as pool:
        jobs = GatedJobs()
        seen: list[int] = []
        shares: list[int | None] = []

        def long_run() -> None:
            for name in ("alone", "beside", "after"):
                context = share_cores()
                seen.append(numba.get_num_threads())
                shares.append(None if context is None else context.threads)
                assert job_context() is context
                jobs.job(name)()  # one workload's worth, until the test releases it

        async with trio.open_nursery() as nursery:
            nursery.start_soon(pool.run_sync, long_run)
            await jobs.wait_started(1)
            nursery.start_soon(jobs.run, pool, "other")
            await jobs.wait_started(2)
            jobs.release("alone")
            await jobs.wait_started(3)
            jobs.release("other")
            while pool.idle_count == 0:  # until "other" has given its worker back
                await trio.sleep(0.001)
            jobs.release("beside")
            await jobs.wait_started(4)
            jobs.release("after")
        assert share_cores() is None  # outside a worker: nothing to share
        assert job_context() is None
        assert await pool.run_sync(numba.get_num_threads) == pool.threads
        assert (await pool.run_sync(job_context)).threads == pool.threads
        assert (await pool.run_sync(pool.between_workloads)).threads == pool.threads
    half = max(1, pool.threads // 2)
    assert seen == shares == [pool.threads, half, half]


def _signalled_within(seconds: float) -> bool:
    """On a worker: whether the job's signal is set within ``seconds``."""
    signal, deadline = job_signal(), time.monotonic() + seconds
    while signal[0] == 0 and time.monotonic() < deadline:
        time.sleep(0.001)
    return bool(signal[0])


async def test_jobs_running_natively_are_signalled_when_what_they_may_use_changes():
    """A job running many workloads in one native call looks at its signal between them
    (``job_signal``) and comes back to Python (``attend``) only when it is set: when a job
    starts beside one that has more threads than its share, when HIGH work starts beside
    lower work, and when its caller is cancelled -- not when a job starts beside one already
    at its share."""
    async with CpuWorkerPool(2) as pool:
        assert pool.threads == 2  # the machines this runs on have two cores or more
        assert job_signal()[0] == 0 and attend()  # off the workers: never set, nothing to do
        seen: dict[str, object] = {}
        other = GatedJobs()

        def alone() -> None:
            seen["alone"] = job_context().threads
            seen["beside"] = _signalled_within(10)  # until the test starts a second job
            seen["goes on"] = attend()
            seen["stepped down"] = job_context().threads
            seen["cleared"] = int(job_signal()[0])
            seen["high"] = _signalled_within(10)  # until the test starts a HIGH job
            seen["not cancelled"] = attend()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(pool.run_sync, alone)
            while "alone" not in seen:
                await trio.sleep(0.001)
            nursery.start_soon(other.run, pool, "beside")
            await other.wait_started(1)
            while "cleared" not in seen:
                await trio.sleep(0.001)
            nursery.start_soon(other.run, pool, "high", Priority.HIGH)
            await other.wait_started(2)
            while "not cancelled" not in seen:
                await trio.sleep(0.001)
            other.release("high")
            other.release("beside")
        assert seen == {
            "alone": 2,
            "beside": True,
            "goes on": True,
            "stepped down": 1,
            "cleared": 0,
            "high": True,
            "not cancelled": True,
        }

        # A caller cancelled while its job runs: the job is told, and attend says stop.
        token = trio.lowlevel.current_trio_token()
        started = trio.Event()
        outcome_: list[bool] = []

        def cancelled_job() -> None:
            attend()  # a signal left by the last job on this worker costs a look, no more
            token.run_sync_soon(started.set)
            outcome_.append(_signalled_within(10))
            outcome_.append(attend())

        with trio.move_on_after(30):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(pool.run_sync, cancelled_job)
                await started.wait()
                nursery.cancel_scope.cancel()
        assert outcome_ == [True, False]

    # A job already at its share is not told when another starts beside it.
    async with CpuWorkerPool(3) as pool:
        jobs = GatedJobs()
        third_started = threading.Event()
        second: list[int] = []

        def at_share() -> None:
            token.run_sync_soon(started.set)
            second.append(job_context().threads)
            third_started.wait(10)
            second.append(int(job_signal()[0]))

        started = trio.Event()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(jobs.run, pool, "first")
            await jobs.wait_started(1)
            nursery.start_soon(pool.run_sync, at_share)
            await started.wait()
            nursery.start_soon(jobs.run, pool, "third")
            await jobs.wait_started(2)
            third_started.set()
            while len(second) < 2:
                await trio.sleep(0.001)
            jobs.release_all()
        assert second == [1, 0]


async def test_a_job_runs_in_the_callers_context():
    import contextvars

    var: contextvars.ContextVar[str] = contextvars.ContextVar("var", default="unset")
    var.set("caller")
    async with CpuWorkerPool(1) as pool:
        assert await pool.run_sync(var.get) == "caller"


async def test_load_warms_layers_up_on_a_cpu_worker(monkeypatch):
    """Warm-up enters numba's parallel regions: in any other thread it would start a second
    OpenMP team, and the runs after it would wake sleeping helpers at every kernel."""
    from flowrt.workers.cpu.acc.workload_factory import AccWorkload

    threads: list[str] = []
    original = AccWorkload.prepare

    def prepare(self):
        threads.append(threading.current_thread().name)
        original(self)

    monkeypatch.setattr(AccWorkload, "prepare", prepare)
    async with flowrt.Runtime(cpu_workers=2) as rt:
        await rt.load(flowrt.optimize(branchy_network(), backends=["CpuAcc", "CpuRef"]))
    assert threads and set(threads) == {"flowrt-cpu-0"}
