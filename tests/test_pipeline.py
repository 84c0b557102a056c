"""Pipelines: stages overlapped over a stream, results in order, errors per request."""

import numpy as np
import pytest
import trio
from fakes import SleepyBackend
from netbuild import branchy_expected, branchy_network

import flowrt
from flowrt.errors import FlowrtError, ResourceError, RunError
from flowrt.registry import BackendRegistry
from flowrt.types import TensorInfo


def _feeds(i: int) -> dict[str, np.ndarray]:
    return {"x": np.full((1, 4), i / 10, np.float32)}


def _two_layer_expected(i: int) -> np.ndarray:
    once = branchy_expected(_feeds(i)["x"])
    return branchy_expected(once + 1)


async def _loaded(rt):
    return await rt.load(flowrt.optimize(branchy_network(), backends=["CpuRef"]))


async def test_pipeline_runs_model_function_model_in_order():
    async with flowrt.Runtime() as rt:
        model = await _loaded(rt)
        pipeline = flowrt.Pipeline([model, lambda out: {"x": out["y"] + 1}, model])
        async with pipeline.stream(max_in_flight=3) as s:
            async with trio.open_nursery() as nursery:

                async def produce():
                    for i in range(12):
                        await s.send(_feeds(i))
                    s.close()

                nursery.start_soon(produce)
                results = [out["y"] async for out in s]
        single = await pipeline.run(_feeds(5))
    assert len(results) == 12
    for i, y in enumerate(results):
        np.testing.assert_allclose(y, _two_layer_expected(i), rtol=1e-6)
    np.testing.assert_allclose(single["y"], _two_layer_expected(5), rtol=1e-6)


async def test_function_stage_may_take_the_original_feeds_and_be_async():
    seen = []

    async def stage(outputs, feeds):
        await trio.sleep(0)
        seen.append(float(feeds["x"][0, 0]))
        return {"x": feeds["x"] * 2}

    async with flowrt.Runtime() as rt:
        model = await _loaded(rt)
        out = await flowrt.Pipeline([model, stage, model]).run(_feeds(3))
    assert seen == [pytest.approx(0.3)]
    np.testing.assert_allclose(out["y"], branchy_expected(_feeds(3)["x"] * 2), rtol=1e-6)


async def test_stages_overlap(autojump_clock):
    """Stage 2 of request i runs while stage 1 of request i+1 does: four requests through two
    one-second stages take five seconds, not eight."""
    log = []

    def stage(name):
        async def run(values):
            log.append((name, "start", trio.current_time()))
            await trio.sleep(1)
            return values

        run.__name__ = name
        return run

    pipeline = flowrt.Pipeline([stage("a"), stage("b")])
    start = trio.current_time()
    async with pipeline.stream() as s:
        for i in range(4):
            await s.send({"i": i})
        s.close()
        got = [v["i"] async for v in s]
    assert got == [0, 1, 2, 3]
    assert trio.current_time() - start == pytest.approx(5)


test_stages_overlap = pytest.mark.trio(clock=trio.testing.MockClock(autojump_threshold=0))(
    test_stages_overlap
)


async def test_a_model_stage_works_on_as_many_requests_as_it_has_pools():
    """A model loaded with three pools runs three requests of its stage at once, and still
    hands them on in order: request 0 sleeps longest, yet comes out first."""
    registry = BackendRegistry()
    registry.register("Sleepy", SleepyBackend)
    net = flowrt.Network()
    net.add_output("y", net.add_layer("Relu", inputs=[net.add_input("x", TensorInfo((2,)))], name="sleep"))
    delays = [0.3, 0.0, 0.1, 0.0, 0.2, 0.0]
    async with flowrt.Runtime(registry, cpu_workers=3, profiling=True) as rt:
        model = await rt.load(flowrt.optimize(net, backends=["Sleepy"], registry=registry), max_in_flight=3)
        pipeline = flowrt.Pipeline([model, lambda out: {"tag": int(out["y"][1])}])
        async with pipeline.stream() as s:
            assert s.max_in_flight == 8  # twice (3 + 1)
            for tag, delay in enumerate(delays):
                await s.send({"x": np.array([delay, tag], np.float32)})
            s.close()
            tags = [out["tag"] async for out in s]
        assert model.pools.free_count == 3
    assert tags == list(range(len(delays)))
    runs = sorted(model.profile(), key=lambda r: r.start_ns)
    first = next(r for r in runs if r.end_ns - r.start_ns >= 0.25e9)
    assert sum(r.start_ns < first.end_ns for r in runs) >= 3


async def test_a_failing_request_gets_a_run_error_naming_the_stage_and_the_rest_go_on():
    def picky(outputs):
        if outputs["i"] == 2:
            raise ValueError("two is not welcome")
        return outputs

    pipeline = flowrt.Pipeline([picky, lambda v: {"i": v["i"] * 10}], names=["picky", "times ten"])
    results = []
    async with pipeline.stream() as s:
        for i in range(4):
            await s.send({"i": i})
        s.close()
        for _ in range(4):
            try:
                results.append((await s.__anext__())["i"])
            except RunError as e:
                results.append(e)
    assert results[:2] == [0, 10] and results[3] == 30
    error = results[2]
    assert error.stage == "picky" and isinstance(error.cause, ValueError)
    assert str(error) == "pipeline stage 'picky' failed: ValueError: two is not welcome"


async def test_model_stage_errors_name_stage_and_layer():
    async with flowrt.Runtime() as rt:
        model = await _loaded(rt)
        pipeline = flowrt.Pipeline([lambda v: {"x": np.ones((1, 5), np.float32)}, model])
        with pytest.raises(RunError, match=r"pipeline stage '1: model' failed: ShapeError") as info:
            await pipeline.run({})
    assert info.value.stage == "1: model"


async def test_stream_is_bounded_and_leaving_early_leaves_nothing_running():
    async with flowrt.Runtime() as rt:
        model = await _loaded(rt)
        pipeline = flowrt.Pipeline([model, lambda out: {"x": out["y"]}, model])
        async with pipeline.stream(max_in_flight=2) as s:
            s.send_nowait(_feeds(1))
            s.send_nowait(_feeds(2))
            with pytest.raises(ResourceError, match="full: 2 requests"):
                s.send_nowait(_feeds(3))
        assert model.pools.free_count == model.pools.count
        with pytest.raises(FlowrtError, match="closed"):
            await s.send(_feeds(4))
        async with pipeline.stream() as s:
            out = await s.submit(_feeds(1))
        np.testing.assert_allclose(out["y"], branchy_expected(branchy_expected(_feeds(1)["x"])), rtol=1e-6)


def test_bad_stages_are_refused():
    with pytest.raises(FlowrtError, match="at least one stage"):
        flowrt.Pipeline([])
    with pytest.raises(FlowrtError, match="stage 0 must be a loaded model or a function, got int"):
        flowrt.Pipeline([3])
    with pytest.raises(FlowrtError, match="2 names given for 1 pipeline stages"):
        flowrt.Pipeline([abs], names=["a", "b"])
