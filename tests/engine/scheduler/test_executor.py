"""The trio executor: concurrency, failure as RunError, cancellation."""

import threading

import numpy as np
import pytest
import trio
from fakes import PartialBackend, SleepyBackend
from netbuild import branchy_expected, branchy_network

import flowrt
from flowrt.errors import RunError
from flowrt.registry import BackendRegistry
from flowrt.workers.cpu.ref import RefBackend


async def test_branches_run_and_match_numpy():
    opt = flowrt.optimize(branchy_network(), backends=["CpuRef"])
    x = np.linspace(-2, 2, 12, dtype=np.float32).reshape(3, 4)
    async with flowrt.Runtime() as rt:
        model = await rt.load(opt)
        out = await model.run({"x": x})
    np.testing.assert_allclose(out["y"], branchy_expected(x), rtol=1e-6)


async def test_a_run_is_one_segment_by_default():
    opt = flowrt.optimize(branchy_network(), backends=["CpuRef"])
    async with flowrt.Runtime() as rt:
        model = await rt.load(opt)
    (segment,) = model.dataflow.segments
    assert [node.layer for node in segment.nodes] == [node.layer for node in model.dataflow.order]
    assert segment.depends_on == frozenset()


async def test_the_workers_share_the_cores_again_before_every_workload(monkeypatch):
    """A run takes its share of the cores before each workload (the host runner's
    ``between_workloads``, ``share_cores``), so one that started alone gives a core up when
    another run starts beside it."""
    from flowrt.workers.cpu.workers import CpuWorkerPool

    calls: list[str] = []
    monkeypatch.setattr(
        CpuWorkerPool, "between_workloads", lambda self: calls.append(threading.current_thread().name)
    )
    opt = flowrt.optimize(branchy_network(), backends=["CpuRef"])
    x = np.linspace(-2, 2, 12, dtype=np.float32).reshape(3, 4)
    async with flowrt.Runtime(cpu_workers=1) as rt:
        model = await rt.load(opt)
        calls.clear()
        await model.run({"x": x})
    assert calls == ["flowrt-cpu-0"] * len(model.dataflow.order)


async def test_parallel_branches_are_separate_segments():
    opt = flowrt.optimize(branchy_network(), backends=["CpuRef"])
    x = np.linspace(-2, 2, 12, dtype=np.float32).reshape(3, 4)
    async with flowrt.Runtime(parallel_branches=True) as rt:
        model = await rt.load(opt)
        out = await model.run({"x": x})
    segments = model.dataflow.segments
    by_layer = {node.layer: seg.index for seg in segments for node in seg.nodes}
    assert by_layer["left"] != by_layer["right"]
    assert segments[by_layer["add"]].depends_on == {by_layer["left"], by_layer["right"]}
    np.testing.assert_allclose(out["y"], branchy_expected(x), rtol=1e-6)


def _failing_registry() -> BackendRegistry:
    registry = BackendRegistry()
    registry.register("CpuRef", RefBackend)
    registry.register("Flaky", lambda: PartialBackend("Flaky", {"Tanh"}, fail_kinds={"Tanh"}))
    return registry


async def test_failing_workload_raises_run_error_naming_layer_backend_and_cause():
    registry = _failing_registry()
    opt = flowrt.optimize(branchy_network(), backends=["Flaky", "CpuRef"], registry=registry)
    async with flowrt.Runtime(registry) as rt:
        model = await rt.load(opt)
        with pytest.raises(
            RunError, match=r"layer 'right' on backend Flaky failed: ValueError: deliberate"
        ) as info:
            await model.run({"x": np.ones((1, 4), np.float32)})
    assert info.value.layer == "right"
    assert info.value.backend == "Flaky"
    assert isinstance(info.value.cause, ValueError)


async def test_runtime_usable_after_a_cancelled_run():
    opt = flowrt.optimize(branchy_network(), backends=["CpuRef"])
    x = np.ones((2, 4), np.float32)
    async with flowrt.Runtime() as rt:
        model = await rt.load(opt)
        with trio.move_on_after(0) as scope:
            await model.run({"x": x})
        assert scope.cancelled_caught
        out = await model.run({"x": x})
    np.testing.assert_allclose(out["y"], branchy_expected(x), rtol=1e-6)


async def test_a_run_cancelled_while_a_worker_runs_it_stops_at_the_next_workload():
    # One segment, two workloads: the first sleeps 0.3 s; the run is cancelled during it.
    registry = BackendRegistry()
    registry.register("CpuRef", RefBackend)
    registry.register("Sleepy", SleepyBackend)
    recorder = PartialBackend("Recorder", {"Tanh"})
    registry.register("Recorder", lambda: recorder)
    net = flowrt.Network()
    x = net.add_input("x", flowrt.TensorInfo((1,)))
    net.add_output("y", net.add_layer("Tanh", inputs=[net.add_layer("Relu", inputs=[x])], name="second"))
    opt = flowrt.optimize(net, backends=["Sleepy", "Recorder", "CpuRef"], registry=registry)
    async with flowrt.Runtime(registry) as rt:
        model = await rt.load(opt)
        assert len(model.dataflow.segments) == 1
        with trio.move_on_after(0.05) as scope:
            await model.run({"x": np.array([0.3], np.float32)})
        assert scope.cancelled_caught
        assert recorder.calls == []  # the worker stopped before the second workload
        out = await model.run({"x": np.array([0.0], np.float32)})
    assert recorder.calls == ["second"]
    np.testing.assert_array_equal(out["y"], [0.0])


async def test_concurrent_runs_of_one_model_keep_their_own_tensors():
    opt = flowrt.optimize(branchy_network(), backends=["CpuRef"])
    results = {}
    async with flowrt.Runtime() as rt:
        model = await rt.load(opt)

        async def one(i: int) -> None:
            x = np.full((2, 4), i / 10, np.float32)
            results[i] = (x, (await model.run({"x": x}))["y"])

        async with trio.open_nursery() as nursery:
            for i in range(8):
                nursery.start_soon(one, i)
    assert len(results) == 8
    for x, y in results.values():
        np.testing.assert_allclose(y, branchy_expected(x), rtol=1e-6)


async def test_outputs_are_fresh_arrays_the_caller_owns():
    net = flowrt.Network()
    x = net.add_input("x", flowrt.TensorInfo((2,)))
    net.add_output("y", net.add_layer("Add", inputs=[x, np.zeros(2, np.float32)]))
    opt = flowrt.optimize(net, backends=["CpuRef"])
    async with flowrt.Runtime() as rt:
        model = await rt.load(opt)
        feed = np.ones(2, np.float32)
        first = (await model.run({"x": feed}))["y"]
        first[:] = 100
        second = (await model.run({"x": feed}))["y"]
    np.testing.assert_array_equal(second, [1, 1])
    assert first.flags.writeable


async def test_load_outside_runtime_context_is_refused():
    rt = flowrt.Runtime()
    with pytest.raises(flowrt.errors.FlowrtError, match="async with Runtime"):
        await rt.load(flowrt.optimize(branchy_network(), backends=["CpuRef"]))


def test_outputs_keep_the_declared_order_not_the_execution_order():
    net = flowrt.Network()
    x = net.add_input("x", flowrt.TensorInfo((2,)))
    late = net.add_layer("Exp", inputs=[net.add_layer("Neg", inputs=[x])], name="late")
    early = net.add_layer("Relu", inputs=[x], name="early")
    net.add_output("second_computed_first", late)
    net.add_output("first_computed", early)
    sess = flowrt.InferenceSession(net, backends=["CpuRef"])
    assert [o.name for o in sess.get_outputs()] == ["second_computed_first", "first_computed"]
    a, b = sess.run(None, {"x": np.array([1.0, -1.0], np.float32)})
    np.testing.assert_allclose(a, np.exp([-1.0, 1.0]), rtol=1e-6)
    np.testing.assert_array_equal(b, [1, 0])
