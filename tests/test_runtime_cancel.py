"""Cancelling the block that holds ``async with flowrt.Runtime()`` while runs are in flight:
the runtime's exit (unloading its networks, closing its nursery, joining its CPU worker
threads, letting go of the memory pools) runs to its end, bounded, and the cancellation then
goes on as trio's own; never a "Nursery stack corrupted", never a thread left running."""

import logging
import threading

import numpy as np
import pytest
import trio
from netbuild import branchy_expected, branchy_network
from test_stream_close import _gated_model

import flowrt
import flowrt.loaded_network
import flowrt.workers.cpu.workers
from flowrt.types import TensorInfo

X = np.linspace(-2, 2, 8, dtype=np.float32).reshape(2, 4)


def _cpu_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("flowrt-cpu")]


def _relu_network() -> flowrt.Network:
    net = flowrt.Network()
    net.add_output("y", net.add_layer("Relu", inputs=[net.add_input("x", TensorInfo(("N", 4)))], name="relu"))
    return net


async def _run_until_cancelled(model, counter: list[int], enough: trio.Event) -> None:
    """Run ``model`` back to back until it is unloaded; ``enough`` is set once 20 runs
    ended, so that runs are surely in flight then (this task starts the next one at once)."""
    while not model.unloaded:
        await model.run({"x": X})
        counter[0] += 1
        if counter[0] >= 20:
            enough.set()


@pytest.mark.parametrize("backend", ["CpuRef", "CpuAcc"])
async def test_cancelling_a_nursery_around_the_runtime_with_runs_in_flight_outside_its_block_is_clean(
    backend,
):
    net = branchy_network() if backend == "CpuRef" else _relu_network()
    optimized = flowrt.optimize(net, backends=[backend])
    before = _cpu_threads()
    counter, enough = [0], trio.Event()
    with trio.fail_after(60):  # CpuAcc compiles its kernel at load on a cold numba cache
        async with trio.open_nursery() as nursery:
            async with flowrt.Runtime(cpu_workers=2) as rt:
                model = await rt.load(optimized)
                pools = model.pools
                for _ in range(4):  # in the outer nursery: in flight while the runtime closes
                    nursery.start_soon(_run_until_cancelled, model, counter, enough)
                await enough.wait()
                nursery.cancel_scope.cancel()
    assert nursery.cancel_scope.cancelled_caught
    assert pools.free_count == pools.count  # every run gave its pool back
    assert [t for t in _cpu_threads() if t not in before] == []  # joined, not merely told to stop
    async with flowrt.Runtime(cpu_workers=2) as rt:  # and the next runtime runs right
        model = await rt.load(optimized)
        expected = branchy_expected(X) if backend == "CpuRef" else np.maximum(X, 0)
        np.testing.assert_allclose((await model.run({"x": X}))["y"], expected, rtol=1e-6)


async def test_a_move_on_after_around_the_runtime_joins_its_threads_before_the_block_ends():
    optimized = flowrt.optimize(branchy_network(), backends=["CpuRef"])
    before = _cpu_threads()
    counter, enough = [0], trio.Event()
    with trio.fail_after(30):
        with trio.CancelScope() as outer:
            async with flowrt.Runtime(cpu_workers=2) as rt:
                model = await rt.load(optimized)
                pools = model.pools
                async with trio.open_nursery() as nursery:
                    for _ in range(4):
                        nursery.start_soon(_run_until_cancelled, model, counter, enough)
                    await enough.wait()
                    outer.cancel()
    assert outer.cancelled_caught
    assert pools.free_count == pools.count
    assert [t for t in _cpu_threads() if t not in before] == []


async def test_cancelling_the_runtime_block_while_it_exits_is_clean():
    """The cancellation arrives while the runtime waits for runs in flight to finish."""
    optimized = flowrt.optimize(branchy_network(), backends=["CpuRef"])
    before = _cpu_threads()
    counter, enough = [0], trio.Event()
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            with trio.CancelScope() as outer:
                async with flowrt.Runtime(cpu_workers=2) as rt:
                    model = await rt.load(optimized)
                    pools = model.pools
                    for _ in range(4):
                        nursery.start_soon(_run_until_cancelled, model, counter, enough)
                    await enough.wait()
                    # The runs go on (refused once the network is unloaded) while the exit
                    # waits for those in flight; this cancels the exit in that wait.
                    nursery.start_soon(_cancel_after_checkpoints, outer, 3)
            nursery.cancel_scope.cancel()
    assert outer.cancelled_caught
    assert pools.free_count == pools.count
    assert [t for t in _cpu_threads() if t not in before] == []


async def _cancel_after_checkpoints(scope: trio.CancelScope, checkpoints: int) -> None:
    for _ in range(checkpoints):
        await trio.sleep(0)
    scope.cancel()


async def test_a_cancelled_unload_still_releases_the_network_and_calls_its_hooks():
    optimized = flowrt.optimize(branchy_network(), backends=["CpuRef"])
    counter, enough = [0], trio.Event()
    with trio.fail_after(30):
        async with flowrt.Runtime(cpu_workers=2) as rt:
            model = await rt.load(optimized)
            pools = model.pools
            async with trio.open_nursery() as nursery:
                for _ in range(4):
                    nursery.start_soon(_run_until_cancelled, model, counter, enough)
                await enough.wait()
                with trio.CancelScope() as scope:
                    scope.cancel()
                    await model.unload()  # cancelled at once: it finishes, then raises Cancelled
                assert scope.cancelled_caught
                assert model.unloaded and pools.free_count == pools.count
                assert model.pools.count == 0  # its pools let go
                with pytest.raises(flowrt.errors.FlowrtError, match="was unloaded"):
                    await model.run({"x": X})
                nursery.cancel_scope.cancel()


async def test_a_cancelled_runtime_exit_waits_for_a_stuck_run_only_so_long(monkeypatch, caplog):
    """A run in a task that nobody cancels holds its worker past the bound: the exit goes on
    without it, logs why, and the cancellation leaves as trio's own."""
    monkeypatch.setattr(flowrt.loaded_network, "UNLOAD_GRACE", 0.2)
    monkeypatch.setattr(flowrt.workers.cpu.workers, "JOIN_GRACE", 0.2)
    caplog.set_level(logging.WARNING)
    gate = threading.Event()
    registry, optimized = _gated_model(gate)
    results: list = []

    async def stuck_run(model, task_status=trio.TASK_STATUS_IGNORED) -> None:
        with trio.CancelScope(shield=True):  # nobody cancels it
            task_status.started()
            results.append(await model.run({"x": np.ones((1, 2), np.float32)}))

    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            with trio.CancelScope() as outer:
                async with flowrt.Runtime(registry, cpu_workers=1) as rt:
                    model = await rt.load(optimized)
                    await nursery.start(stuck_run, model)
                    await trio.sleep(0.05)  # the run reaches its worker
                    outer.cancel()
            assert outer.cancelled_caught
            assert "1 run(s) still in flight" in caplog.text
            assert "did not end" in caplog.text
            gate.set()  # the run ends: its result comes back all the same
    assert results and results[0]["y"].shape == (1, 2)
