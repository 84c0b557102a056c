"""The public async API under asyncio as under trio: the README's examples, the same results,
asyncio's cancellation returning every pool, errors of flowrt's own types.

Plain test functions that call ``asyncio.run`` (pytest-trio runs every ``async def`` test under
trio); the trio twins call ``trio.run``. Everything runs on CpuRef or a gated fake backend.
"""

from __future__ import annotations

import asyncio
import threading

import numpy as np
import onnx
import pytest
import sniffio
import test_argument_validation
import test_backends_contexts
import test_flowrt_file_validation
import test_max_in_flight
import test_memory_budget
import test_model_file_errors
import test_pipeline
import test_profiling
import test_session_async
import test_stream
import test_stream_close
import test_stream_errors
import trio
from fakes import SleepyBackend
from gatedbackend import Gate, GatedBackend
from netbuild import branchy_expected, branchy_network
from onnx import TensorProto, helper

import flowrt
from flowrt.errors import ArgumentError, FlowrtError, InputError, RunError
from flowrt.registry import BackendRegistry
from flowrt.types import TensorInfo

X = np.linspace(-2, 2, 8, dtype=np.float32).reshape(2, 4)
ONE = {"x": np.ones(1, np.float32)}


def _run_both(scenario, *args):
    """``scenario(*args)`` under trio and under asyncio: both results."""
    return trio.run(scenario, *args), asyncio.run(scenario(*args))


def _flowrt_threads() -> set[threading.Thread]:
    return {t for t in threading.enumerate() if t.name.startswith(("flowrt-runtime", "flowrt-cpu"))}


# -- the README's examples, copied from its sections ------------------------------------------------


def _write_readme_model(path) -> None:
    """A model.onnx with the README's input name: data_0 (1, 4) -> Relu -> prob."""
    graph = helper.make_graph(
        [helper.make_node("Relu", ["data_0"], ["prob"], name="relu")],
        "readme",
        [helper.make_tensor_value_info("data_0", TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor_value_info("prob", TensorProto.FLOAT, [1, 4])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, path)


async def _readme_main(x, results):
    # "## Python API", verbatim but for the results kept for the test.
    net = flowrt.onnx.load("model.onnx")  # -> flowrt.Network
    opt = flowrt.optimize(net, backends=["CpuAcc", "CpuRef"])  # -> flowrt.OptimizedNetwork
    print(opt.assignments())  # {layer_name: backend_id}
    print(opt.report())  # what `flowrt inspect` prints
    async with flowrt.Runtime() as rt:
        model = await rt.load(opt)  # -> flowrt.LoadedNetwork
        outputs = await model.run({"data_0": x})  # {output name: np.ndarray}
    results.append(outputs)


def test_the_readme_async_example_runs_under_trio_and_asyncio(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    _write_readme_model("model.onnx")
    x = np.array([[-1.0, 0.5, -0.25, 2.0]], np.float32)
    under_trio: list = []
    under_asyncio: list = []

    async def main():
        await _readme_main(x, under_trio)

    trio.run(main)

    async def main():  # noqa: F811 (the README's asyncio twin calls the same main())
        await _readme_main(x, under_asyncio)

    asyncio.run(main())
    np.testing.assert_array_equal(under_trio[0]["prob"], np.maximum(x, 0))
    np.testing.assert_array_equal(under_asyncio[0]["prob"], under_trio[0]["prob"])


async def _readme_stream_trio(model, camera, received):
    # "### Streams", the trio example.
    async with model.stream(max_in_flight=4) as s:

        async def produce():
            for frame in camera:
                await s.send({"data_0": frame})  # waits while 4 requests are held (backpressure)
            s.close()  # iteration ends after the last result

        async with trio.open_nursery() as nursery:
            nursery.start_soon(produce)
            async for outputs in s:  # submission order
                received.append(outputs)

    async with model.stream() as s:
        received.append(await s.submit({"data_0": camera[0]}))  # request style


async def _readme_stream_asyncio(model, camera, received):
    # "### Streams", the asyncio example.
    async with model.stream(max_in_flight=4) as s:

        async def produce():
            for frame in camera:
                await s.send({"data_0": frame})
            s.close()

        async with asyncio.TaskGroup() as tasks:
            tasks.create_task(produce())
            async for outputs in s:
                received.append(outputs)

    async with model.stream() as s:
        received.append(await s.submit({"data_0": camera[0]}))


def test_the_readme_stream_example_runs_under_trio_and_asyncio():
    net = flowrt.Network()
    x = net.add_input("data_0", TensorInfo((1, 4)))
    net.add_output("prob", net.add_layer("Relu", inputs=[x], name="relu"))
    opt = flowrt.optimize(net, backends=["CpuRef"])
    camera = [np.full((1, 4), i - 3, np.float32) for i in range(7)]

    async def main(example):
        received: list = []
        async with flowrt.Runtime(cpu_workers=2) as rt:
            model = await rt.load(opt, max_in_flight=2)
            await example(model, camera, received)
            assert model.pools.free_count == 2
        return [float(o["prob"][0, 0]) for o in received]

    under_trio = trio.run(main, _readme_stream_trio)
    under_asyncio = asyncio.run(main(_readme_stream_asyncio))
    assert under_trio == [0.0, 0.0, 0.0, 0.0, 1.0, 2.0, 3.0, 0.0]
    assert under_asyncio == under_trio


# -- the same API, the same results ----------------------------------------------------------------


async def _everything(opt):
    """load, run, streams (plain and batching), pipeline run and stream, profile, unload."""
    results = {}
    async with flowrt.Runtime(cpu_workers=2, profiling=True) as rt:
        model = await rt.load(opt, max_in_flight=2)
        results["inputs"] = model.inputs
        results["run"] = (await model.run({"x": X}))["y"]
        async with model.stream(max_in_flight=3) as s:
            for i in range(3):
                s.send_nowait({"x": X + i})
            s.close()
            results["stream"] = [o["y"] async for o in s]
        single = await rt.load(opt, batch=1)
        async with single.stream(max_batch=2, max_delay=0.001) as s:
            results["batched"] = [(await s.submit({"x": X[i : i + 1]}))["y"] for i in range(2)]

        async def double(outputs):
            await (asyncio.sleep(0) if sniffio.current_async_library() == "asyncio" else trio.sleep(0))
            return {"x": outputs["y"] * 2}

        pipeline = flowrt.Pipeline([model, double, model])
        results["pipeline"] = (await pipeline.run({"x": X}))["y"]
        async with pipeline.stream() as s:
            await s.send({"x": X})
            await s.send({"x": -X})
            s.close()
            results["pipeline stream"] = [o["y"] async for o in s]
        results["profiled layers"] = sorted({r.layer for r in model.profile()})
        results["memory"] = model.memory_report()
        await single.unload()
        results["pools"] = (model.pools.free_count, single.pools.count)
    return results


def test_load_run_streams_and_pipelines_give_the_same_results_under_asyncio_as_under_trio():
    opt = flowrt.optimize(branchy_network(), backends=["CpuRef"])
    under_trio, under_asyncio = _run_both(_everything, opt)
    np.testing.assert_allclose(under_trio["run"], branchy_expected(X), rtol=1e-6)
    assert under_asyncio.keys() == under_trio.keys()
    for key, expected in under_trio.items():
        np.testing.assert_equal(under_asyncio[key], expected, err_msg=key)
    assert under_asyncio["pools"] == (2, 0)  # every pool back; the unloaded model's let go


def test_the_asyncio_faces_are_the_engines_types_and_forward_attributes():
    opt = flowrt.optimize(branchy_network(), backends=["CpuRef"])

    async def main():
        async with flowrt.Runtime(cpu_workers=1) as rt:
            model = await rt.load(opt, max_in_flight=3)
            assert isinstance(model, flowrt.LoadedNetwork)
            assert model.pools.count == 3 and model.network_id == 0 and not model.unloaded
            assert list(model.outputs) == ["y"]
            stream = model.stream(max_in_flight=5)
            assert stream.max_in_flight == 5
            with pytest.raises(ArgumentError, match="max_in_flight must be a positive int, got 0"):
                model.stream(max_in_flight=0)

    asyncio.run(main())


# Public async tests written for trio that use no trio call of their own: under asyncio too, with
# the arguments of their parametrized cases. Those that open trio nurseries or cancel scopes, or
# take pytest-trio's clock, stay trio-only; asyncio's cancellation has its own tests below.
UNDER_BOTH = [
    (test_argument_validation, "test_bad_load_arguments_are_refused", {}),
    (test_backends_contexts, "test_hooks_are_called_with_the_network_id_around_load_and_unload", {}),
    (test_backends_contexts, "test_cpuacc_takes_its_arenas_from_a_user_allocator", {}),
    (test_flowrt_file_validation, "test_cpuref_refuses_to_build_a_layer_that_carries_a_fused_activation", {}),
    (test_max_in_flight, "test_a_max_in_flight_whose_pools_pass_the_memory_budget_is_refused_naming_it", {}),
    (test_memory_budget, "test_a_load_whose_arenas_pass_the_runtime_budget_is_refused_naming_the_layer", {}),
    (test_memory_budget, "test_the_runtime_budget_counts_the_networks_it_holds_until_they_are_unloaded", {}),
    (test_model_file_errors, "test_ragged_nested_lists_as_a_feed_are_an_input_error_naming_the_input", {}),
    (test_pipeline, "test_model_stage_errors_name_stage_and_layer", {}),
    (test_pipeline, "test_stream_is_bounded_and_leaving_early_leaves_nothing_running", {}),
    (test_pipeline, "test_a_model_stage_works_on_as_many_requests_as_it_has_pools", {}),
    (test_profiling, "test_profiled_run_records_every_workload", {}),
    (test_profiling, "test_runtime_profiling_records_every_run_by_default", {}),
    (test_session_async, "test_run_works_from_inside_a_trio_loop", {}),  # here: inside an asyncio loop
    (test_stream, "test_an_error_reaches_only_its_own_request", {}),
    (test_stream_errors, "test_a_shape_error_from_submit_leaves_the_block_as_a_shape_error", {}),
    *(
        (module, name, {"kind": kind})
        for module, name in [
            (test_stream_errors, "test_a_run_error_received_in_the_block_leaves_it_as_a_run_error"),
            (
                test_stream_errors,
                "test_a_user_error_in_the_block_leaves_it_as_itself_with_its_cause_and_traceback",
            ),
            (test_stream_errors, "test_a_keyboard_interrupt_in_the_block_leaves_it_bare"),
            (test_stream_close, "test_a_closed_stream_refuses_sends_and_reopening"),
        ]
        for kind in module.KINDS  # model, batching and pipeline streams
    ),
]


@pytest.mark.parametrize(
    ("module", "name", "kwargs"),
    UNDER_BOTH,
    ids=[name + "".join(f"[{v}]" for v in kwargs.values()) for _, name, kwargs in UNDER_BOTH],
)
def test_a_public_async_test_passes_under_asyncio_too(module, name, kwargs):
    asyncio.run(getattr(module, name)(**kwargs))


# -- cancellation from asyncio -----------------------------------------------------------------------


def _gated_parts(layers: int = 1):
    """x (1,) -> ``layers`` copies, each holding its CPU worker until the gate is released."""
    gate = Gate()
    registry = BackendRegistry()
    registry.register(GatedBackend.id, lambda: type("Bound", (GatedBackend,), {"gate": gate})())
    net = flowrt.Network()
    y = net.add_input("x", TensorInfo((1,)))
    for i in range(layers):
        y = net.add_layer("Relu", inputs=[y], name=f"copy{i}")
    net.add_output("y", y)
    return registry, flowrt.optimize(net, backends=[GatedBackend.id], registry=registry), gate


def test_asyncio_timeout_mid_run_stops_the_run_and_waits_for_it_to_give_its_pool_back():
    registry, opt, gate = _gated_parts(layers=2)

    async def main():
        async with flowrt.Runtime(registry, cpu_workers=1) as rt:
            model = await rt.load(opt, max_in_flight=1)
            budgets = []

            async def timed_run():
                async with asyncio.timeout(None) as budget:
                    budgets.append(budget)
                    await model.run(ONE)

            task = asyncio.create_task(timed_run())
            assert await asyncio.to_thread(gate.wait_started)  # in its kernel, holding its pool
            budgets[0].reschedule(asyncio.get_running_loop().time())  # time is up
            await asyncio.sleep(0.05)
            assert not task.done() and model.pools.free_count == 0  # the kernel still runs
            gate.release()
            with pytest.raises(TimeoutError):
                await asyncio.wait_for(task, 10)
            assert model.pools.free_count == 1
            assert not gate.wait_started(timeout=0.1)  # stopped before its second layer
            assert (await model.run(ONE))["y"][0] == 1.0  # still usable

    try:
        asyncio.run(main())
    finally:
        gate.release()


def test_cancelling_an_asyncio_task_cancels_its_run_waiting_for_a_pool():
    registry, opt, gate = _gated_parts()

    async def main():
        async with flowrt.Runtime(registry, cpu_workers=2) as rt:
            model = await rt.load(opt, max_in_flight=1)
            holder = asyncio.create_task(model.run(ONE))
            assert await asyncio.to_thread(gate.wait_started)
            waiter = asyncio.create_task(model.run(ONE))  # waits for the one pool
            await asyncio.sleep(0.05)
            waiter.cancel()
            done, _ = await asyncio.wait([waiter], timeout=10)  # while the gate is still shut
            assert waiter in done and waiter.cancelled()
            gate.release()
            assert (await holder)["y"][0] == 1.0
            assert model.pools.free_count == 1

    try:
        asyncio.run(main())
    finally:
        gate.release()


def test_an_asyncio_timeout_around_a_stream_cancels_its_requests_and_returns_every_pool():
    registry, opt, gate = _gated_parts()
    before = _flowrt_threads()

    async def main():
        async with flowrt.Runtime(registry, cpu_workers=2) as rt:
            model = await rt.load(opt, max_in_flight=2)

            async def release_once_cancelled(budget):
                for _ in range(2):
                    assert await asyncio.to_thread(gate.wait_started)
                budget.reschedule(asyncio.get_running_loop().time())
                await asyncio.sleep(0.05)
                gate.release()

            with pytest.raises(TimeoutError):
                async with asyncio.timeout(None) as budget, model.stream(max_in_flight=2) as s:
                    releaser = asyncio.create_task(release_once_cancelled(budget))
                    await s.send(ONE)
                    await s.send(ONE)
                    await asyncio.sleep(30)
            await releaser
            assert model.pools.free_count == 2
            async with model.stream(max_in_flight=2) as s:  # a new stream works
                assert (await s.submit(ONE))["y"][0] == 1.0

    try:
        asyncio.run(main())
    finally:
        gate.release()
    assert _flowrt_threads() <= before  # the runtime's thread and its workers ended


# -- errors and sharing ------------------------------------------------------------------------------


def test_errors_from_the_engine_arrive_under_asyncio_as_flowrts_own_types():
    registry = BackendRegistry()
    registry.register("Sleepy", SleepyBackend)
    net = flowrt.Network()
    net.add_output("y", net.add_layer("Relu", inputs=[net.add_input("x", TensorInfo((2,)))], name="sleep"))
    opt = flowrt.optimize(net, backends=["Sleepy"], registry=registry)

    async def main():
        async with flowrt.Runtime(registry, cpu_workers=1) as rt:
            with pytest.raises(ArgumentError, match="optimized must be an OptimizedNetwork"):
                await rt.load(net)
            model = await rt.load(opt)
            with pytest.raises(InputError, match="unknown input 'z'"):
                await model.run({"z": np.zeros(2, np.float32)})
            # the asyncio face of a model is named as under trio
            with pytest.raises(ArgumentError, match="stages must be a list .*, got one loaded model"):
                flowrt.Pipeline(model)  # type: ignore[arg-type]
            async with model.stream() as s:
                with pytest.raises(InputError, match="unknown input 'z'"):
                    await s.submit({"z": np.zeros(2, np.float32)})
                await s.send({"x": np.array([-1, 0], np.float32)})  # a negative delay fails
                with pytest.raises(RunError, match="negative delay"):
                    await s.__anext__()
        with pytest.raises(FlowrtError, match="needs an active runtime"):
            await rt.load(opt)
        with pytest.raises(FlowrtError, match="Runtime is closed"):
            await model.run({"x": np.zeros(2, np.float32)})

    asyncio.run(main())


def test_two_asyncio_tasks_share_one_runtime():
    opt = flowrt.optimize(branchy_network(), backends=["CpuRef"])

    async def main():
        async with flowrt.Runtime(cpu_workers=2) as rt:
            first = await rt.load(opt, max_in_flight=2)

            async def worker(offset):
                model = first if offset == 0 else await rt.load(opt, max_in_flight=1)
                outputs = [(await model.run({"x": X + offset}))["y"] for _ in range(10)]
                if model is not first:
                    await rt.unload(model)
                return outputs

            async with asyncio.TaskGroup() as tasks:
                runs = [tasks.create_task(worker(offset)) for offset in (0, 1)]
            assert first.pools.free_count == 2
        return [r.result() for r in runs]

    for offset, outputs in enumerate(asyncio.run(main())):
        for y in outputs:
            np.testing.assert_allclose(y, branchy_expected(X + offset), rtol=1e-6)


def test_an_async_pipeline_stage_runs_on_the_callers_asyncio_loop():
    opt = flowrt.optimize(branchy_network(), backends=["CpuRef"])

    async def main():
        seen = []

        async def stage(outputs):
            seen.append((asyncio.get_running_loop(), threading.current_thread()))
            await asyncio.sleep(0)
            return {"x": outputs["y"]}

        async with flowrt.Runtime(cpu_workers=1) as rt:
            model = await rt.load(opt)
            y = (await flowrt.Pipeline([model, stage, model]).run({"x": X}))["y"]
        assert seen == [(asyncio.get_running_loop(), threading.current_thread())]
        return y

    np.testing.assert_allclose(asyncio.run(main()), branchy_expected(branchy_expected(X)), rtol=1e-6)


def test_a_pipeline_of_models_of_two_asyncio_runtimes_is_refused():
    opt = flowrt.optimize(branchy_network(), backends=["CpuRef"])

    async def main():
        async with flowrt.Runtime(cpu_workers=1) as rt1, flowrt.Runtime(cpu_workers=1) as rt2:
            models = [await rt1.load(opt), await rt2.load(opt)]
            with pytest.raises(ArgumentError, match="models loaded by one runtime"):
                flowrt.Pipeline(models)

    asyncio.run(main())
