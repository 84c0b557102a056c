"""flowrt.ray.Pipeline on a two-node local cluster: placement, order, backpressure, faults, and
the same interface as a local pipeline, from trio and from asyncio."""

from __future__ import annotations

import asyncio
import os
import signal
import time

import numpy as np
import pytest
import trio

import flowrt
from flowrt import TensorInfo
from flowrt.errors import ResourceError, RunError

ray = pytest.importorskip(
    "ray", reason="flowrt.ray needs Ray: pip install 'flowrt[ray]'", exc_type=ImportError
)
import flowrt.ray  # noqa: E402  # with Ray only
from flowrt.ray import Stage  # noqa: E402

BACKENDS = ["CpuRef"]  # no numba compile in the replicas' fresh processes


def dense_net(inputs: str, outputs: str, width: int = 8, depth: int = 1, seed: int = 0) -> flowrt.Network:
    """``depth`` MatMul + Relu layers of ``width`` units on a (4, width) input: a stand-in model
    whose run takes longer as ``width`` and ``depth`` grow."""
    rng = np.random.default_rng(seed)
    net = flowrt.Network()
    x = net.add_input(inputs, TensorInfo((4, width)))
    for _ in range(depth):
        weights = (rng.standard_normal((width, width)) / np.sqrt(width)).astype(np.float32)
        x = net.add_layer("Relu", inputs=[net.add_layer("MatMul", inputs=[x, weights])])
    net.add_output(outputs, x)
    return net


def softmax_net(inputs: str, outputs: str, width: int = 8) -> flowrt.Network:
    """A second model: its input sharpened, then a Softmax."""
    net = flowrt.Network()
    x = net.add_input(inputs, TensorInfo((4, width)))
    sharper = net.add_layer("Mul", inputs=[x, np.full((4, width), 3.0, np.float32)])
    net.add_output(outputs, net.add_layer("Softmax", inputs=[sharper]))
    return net


def requests(n: int, width: int = 8) -> list[dict[str, np.ndarray]]:
    """``n`` feeds for ``dense_net``, each different from the others (so that order shows)."""
    ramp = np.linspace(-1.0, 1.0, 4 * width, dtype=np.float32).reshape(4, width)
    return [{"x": ramp * (i + 1) + np.float32(i % 2)} for i in range(n)]


async def local_results(stages, feeds_list):
    """What a local flowrt.Pipeline of the same networks and functions gives each request."""
    async with flowrt.Runtime(cpu_workers=1) as rt:
        local = []
        for stage in stages:
            if isinstance(stage, Stage):
                local.append(await rt.load(flowrt.optimize(stage.model, BACKENDS)))
            else:
                local.append(stage)
        pipeline = flowrt.Pipeline(local)
        return [await pipeline.run(feeds) for feeds in feeds_list]


def assert_same(results, expected):
    assert len(results) == len(expected)
    for got, want in zip(results, expected):
        assert got.keys() == want.keys()
        for name in want:
            # float32 sums in another process may round apart (BLAS picks its kernels by
            # alignment and threads): equal to a millionth of the output's scale
            scale = max(1.0, float(np.abs(want[name]).max()))
            np.testing.assert_allclose(got[name], want[name], rtol=1e-5, atol=1e-6 * scale)


async def test_stages_run_on_the_nodes_they_are_placed_on(cluster):
    stages = [
        Stage(dense_net("x", "h"), name="dense", node=cluster["head"], backends=BACKENDS, num_cpus=0),
        Stage(
            softmax_net("h", "y"), name="softmax", resources={"worker": 0.1}, backends=BACKENDS, num_cpus=0
        ),
    ]
    feeds = requests(3)
    async with flowrt.ray.Pipeline(stages) as pipeline:
        assert pipeline.placement == {"dense": [cluster["head"]], "softmax": [cluster["worker"]]}
        results = [await pipeline.run(f) for f in feeds]
    assert_same(results, await local_results(stages, feeds))


async def test_a_flowrt_file_travels_to_the_replicas_as_its_bytes(cluster, tmp_path):
    path = tmp_path / "dense.flowrt"
    flowrt.save(flowrt.optimize(dense_net("x", "h"), BACKENDS), path)
    stages = [Stage(path, name="dense", num_cpus=0)]
    feeds = requests(2)
    async with flowrt.ray.Pipeline(stages) as pipeline:
        results = [await pipeline.run(f) for f in feeds]
    assert_same(results, await local_results([Stage(dense_net("x", "h"))], feeds))


async def test_replicas_go_to_the_bundles_of_a_placement_group(cluster):
    group = ray.util.placement_group([{"CPU": 1}, {"CPU": 1}], strategy="STRICT_SPREAD")
    try:
        await trio.to_thread.run_sync(ray.get, group.ready())
        stages = [
            Stage(
                dense_net("x", "h"),
                name="dense",
                replicas=2,
                placement_group=group,
                bundle_indices=[0, 1],
                backends=BACKENDS,
            )
        ]
        feeds = requests(2)
        async with flowrt.ray.Pipeline(stages) as pipeline:
            assert sorted(pipeline.placement["dense"]) == sorted(cluster.values())  # one on each node
            results = [await pipeline.run(f) for f in feeds]
    finally:
        ray.util.remove_placement_group(group)
    assert_same(results, await local_results(stages, feeds))


async def test_stream_returns_results_in_submission_order_from_every_replica(cluster):
    stages = [
        Stage(dense_net("x", "h"), name="dense", replicas=2, backends=BACKENDS, num_cpus=0),
        Stage(softmax_net("h", "y"), name="softmax", backends=BACKENDS, num_cpus=0),
    ]
    feeds = requests(30)
    async with flowrt.ray.Pipeline(stages) as pipeline:
        results = []
        async with pipeline.stream() as s:

            async def produce():
                for f in feeds:
                    await s.send(f)
                s.close()

            async with trio.open_nursery() as nursery:
                nursery.start_soon(produce)
                async for outputs in s:
                    results.append(outputs)
        served = [r.served for r in pipeline.replicas("dense")]
    assert_same(results, await local_results(stages, feeds))
    assert sum(served) == len(feeds) and min(served) > 0, served


async def test_function_stages_run_on_the_driver_between_model_stages(cluster):
    def to_scores(outputs, feeds):  # model 1's outputs and the request's feeds -> model 2's feeds
        return {"scores": outputs["h"] + feeds["x"]}

    async def label(outputs):
        await trio.sleep(0)
        return {"y": outputs["y"], "label": np.asarray(outputs["y"].argmax())}

    stages = [
        Stage(dense_net("x", "h"), backends=BACKENDS, num_cpus=0),
        to_scores,
        Stage(softmax_net("scores", "y"), backends=BACKENDS, num_cpus=0),
        label,
    ]
    feeds = requests(4)
    async with flowrt.ray.Pipeline(stages, priority="high") as pipeline:
        results = [await pipeline.run(f) for f in feeds]
    assert_same(results, await local_results(stages, feeds))


async def test_a_stage_holds_at_most_its_bound_and_the_stream_its_own(cluster):
    stages = [
        Stage(
            dense_net("x", "h", width=128, depth=6),
            replicas=2,
            max_in_flight=1,
            backends=BACKENDS,
            num_cpus=0,
        )
    ]
    feeds = requests(16, width=128)
    seen = []  # requests in flight on each replica, sampled while the stream runs
    async with flowrt.ray.Pipeline(stages) as pipeline:
        async with pipeline.stream(max_in_flight=6) as s:
            for f in feeds[:6]:
                s.send_nowait(f)
            with pytest.raises(ResourceError, match="6 requests"):
                s.send_nowait(feeds[6])

            async def produce():
                for f in feeds[6:]:
                    await s.send(f)  # waits for a slot: received results make room
                s.close()

            async def sample():
                while True:
                    seen.append([r.in_flight for r in pipeline.replicas()])
                    await trio.sleep(0.001)

            results = []
            async with trio.open_nursery() as nursery:
                nursery.start_soon(produce)
                nursery.start_soon(sample)
                async for outputs in s:
                    results.append(outputs)
                nursery.cancel_scope.cancel()
    assert max(max(counts) for counts in seen) == 1  # the stage's bound: 1 per replica
    assert max(sum(counts) for counts in seen) == 2
    assert_same(results, await local_results(stages, feeds))


def kill_process(replica):
    os.kill(replica.pid, signal.SIGKILL)


def kill_actor(replica):
    ray.kill(replica.actor, no_restart=False)


@pytest.mark.parametrize("kill", [kill_process, kill_actor], ids=["process-killed", "ray.kill"])
async def test_a_killed_replica_loses_no_request_and_answers_none_twice(cluster, kill):
    stages = [
        Stage(
            dense_net("x", "h", width=512, depth=8), name="dense", replicas=2, backends=BACKENDS, num_cpus=0
        ),
    ]
    feeds = requests(40, width=512)
    async with flowrt.ray.Pipeline(stages) as pipeline:
        results = []
        async with pipeline.stream(max_in_flight=40) as s:
            for f in feeds:
                s.send_nowait(f)
            s.close()
            async for outputs in s:
                results.append(outputs)
                if len(results) == 3:  # mid-stream, while replica 0 has requests in flight
                    with trio.fail_after(5):
                        while pipeline.replicas("dense")[0].in_flight == 0:
                            await trio.sleep(0.001)
                    kill(pipeline.replicas("dense")[0])
        assert pipeline.retries["dense"] >= 1
        with trio.fail_after(30):  # Ray restarts it; the pipeline takes it back
            while pipeline.replicas("dense")[0].state != "live":
                await trio.sleep(0.1)
        assert pipeline.replicas("dense")[0].restarts == 1
        again = await pipeline.run(feeds[0])
        assert sum(r.served for r in pipeline.replicas("dense")) == len(feeds) + 1
    expected = await local_results(stages, feeds)
    assert_same(results, expected)  # each request once, in order
    assert_same([again], expected[:1])


async def test_a_stage_with_no_live_replica_fails_fast_naming_stage_and_node(cluster):
    stages = [Stage(dense_net("x", "h"), name="dense", backends=BACKENDS, num_cpus=0, max_restarts=0)]
    feeds = requests(2)
    async with flowrt.ray.Pipeline(stages) as pipeline:
        (replica,) = pipeline.replicas("dense")
        ray.kill(replica.actor, no_restart=True)
        with trio.fail_after(10):  # until Ray has it dead (the kill takes effect on its own time:
            while True:  # a call made before it may still be answered)
                try:
                    await trio.to_thread.run_sync(ray.get, replica.actor.ready.remote())
                except ray.exceptions.RayActorError:
                    break
                await trio.sleep(0.05)
        with pytest.raises(RunError) as died:
            await pipeline.run(feeds[0])
        assert died.value.stage == "dense"
        assert replica.node in str(died.value) and "no other replica" in str(died.value)
        with trio.fail_after(10):
            while pipeline.replicas("dense")[0].state != "dead":
                await trio.sleep(0.05)
        start = time.perf_counter()
        with pytest.raises(RunError, match="stage 'dense' has no live replica") as none:
            await pipeline.run(feeds[1])
        assert time.perf_counter() - start < 0.5
        assert replica.node in str(none.value)


async def test_leaving_a_stream_early_drops_its_requests_and_the_pipeline_goes_on(cluster):
    stages = [
        Stage(
            dense_net("x", "h", width=512, depth=8), name="dense", replicas=2, backends=BACKENDS, num_cpus=0
        )
    ]
    feeds = requests(20, width=512)
    async with flowrt.ray.Pipeline(stages) as pipeline:
        async with pipeline.stream(max_in_flight=20) as s:
            for f in feeds:
                s.send_nowait(f)
            first = await s.__anext__()
        # the block ended with requests in flight: each was dropped, none is left counted
        assert sum(r.in_flight for r in pipeline.replicas()) == 0
        again = await pipeline.run(feeds[1])
    assert_same([first, again], await local_results(stages, feeds[:2]))


async def test_a_failed_run_reaches_its_request_and_the_others_go_on(cluster):
    stages = [Stage(dense_net("x", "h"), name="dense", backends=BACKENDS, num_cpus=0)]
    feeds = requests(3)
    bad = {"x": np.zeros((4, 9), np.float32)}
    async with flowrt.ray.Pipeline(stages) as pipeline:
        async with pipeline.stream() as s:
            await s.send(feeds[0])
            await s.send(bad)
            await s.send(feeds[1])
            s.close()
            first = await s.__anext__()
            with pytest.raises(RunError) as failed:
                await s.__anext__()
            last = await s.__anext__()
    assert failed.value.stage == "dense"
    assert isinstance(failed.value.cause, flowrt.errors.ShapeError)
    assert_same([first, last], await local_results(stages, [feeds[0], feeds[1]]))


async def test_a_stage_the_cluster_cannot_place_is_a_resource_error(cluster):
    stages = [Stage(dense_net("x", "h"), resources={"nowhere": 1}, backends=BACKENDS, num_cpus=0)]
    with pytest.raises(ResourceError, match="replica 0 of stage '0: model'"):
        async with flowrt.ray.Pipeline(stages, start_timeout=1.0):
            pass


def test_the_pipeline_runs_under_asyncio(cluster):
    async def rescale(outputs):  # an async function stage: runs as a task of the caller's loop
        await asyncio.sleep(0)
        return {"h": outputs["h"] * 0.5}

    stages = [
        Stage(dense_net("x", "h"), replicas=2, backends=BACKENDS, num_cpus=0),
        rescale,
        Stage(softmax_net("h", "y"), backends=BACKENDS, num_cpus=0),
    ]
    feeds = requests(10)

    async def main():
        async with flowrt.ray.Pipeline(stages, priority=flowrt.Priority.LOW) as pipeline:
            one = await pipeline.run(feeds[0])
            async with pipeline.stream(max_in_flight=4) as s:
                submitted = await s.submit(feeds[1])
                s.send_nowait(feeds[0])

                async def produce():
                    for f in feeds[1:]:
                        await s.send(f)
                    s.close()

                task = asyncio.create_task(produce())
                results = [outputs async for outputs in s]
                await task
            return one, submitted, results

    one, submitted, results = asyncio.run(main())
    expected = asyncio.run(local_results(stages, feeds))
    assert_same([one, submitted], expected[:2])
    assert_same(results, expected)
