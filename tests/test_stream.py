"""Streams: ordered results, backpressure, errors per request, cancellation."""

import threading

import numpy as np
import pytest
import trio
import trio.testing
from fakes import PartialBackend, SleepyBackend

import flowrt
from flowrt import hints
from flowrt.errors import FlowrtError, ResourceError, RunError, ShapeError
from flowrt.registry import BackendRegistry
from flowrt.types import TensorInfo


def _sleepy_model_parts(shape=(2,)):
    """A one-layer model that sleeps as many seconds as its first input element; ``(1, 2)``:
    batchable."""
    registry = BackendRegistry()
    registry.register("Sleepy", SleepyBackend)
    net = flowrt.Network()
    x = net.add_input("x", TensorInfo(shape))
    net.add_output("y", net.add_layer("Relu", inputs=[x], name="sleep"))
    return registry, flowrt.optimize(net, backends=["Sleepy"], registry=registry)


def _req(delay: float, tag: float) -> dict:
    return {"x": np.array([delay, tag], np.float32)}


async def test_results_come_back_in_submission_order():
    registry, opt = _sleepy_model_parts()
    delays = [0.06, 0.0, 0.03, 0.01, 0.0, 0.02]
    async with flowrt.Runtime(registry, cpu_workers=4) as rt:
        model = await rt.load(opt, max_in_flight=4)
        async with model.stream(max_in_flight=4) as s:

            async def produce():
                for tag, delay in enumerate(delays):
                    await s.send(_req(delay, tag))
                s.close()

            received = []
            async with trio.open_nursery() as nursery:
                nursery.start_soon(produce)
                async for outputs in s:
                    received.append(int(outputs["y"][1]))
        assert model.pools.free_count == 4
    assert received == list(range(len(delays)))


async def test_a_full_stream_refuses_send_nowait_and_makes_send_wait():
    registry, opt = _sleepy_model_parts()
    async with flowrt.Runtime(registry) as rt:
        model = await rt.load(opt, max_in_flight=2)
        async with model.stream(max_in_flight=2) as s:
            s.send_nowait(_req(0.0, 1))
            await s.send(_req(0.0, 2))
            with pytest.raises(ResourceError, match="stream is full: 2 requests"):
                s.send_nowait(_req(0.0, 3))
            sent_third = trio.Event()

            async def third():
                await s.send(_req(0.0, 3))
                sent_third.set()

            async with trio.open_nursery() as nursery:
                nursery.start_soon(third)
                await trio.sleep(0.05)
                assert not sent_third.is_set()  # nothing dropped, nothing over the bound
                first = await s.__anext__()
                await sent_third.wait()
            s.close()
            rest = [int(o["y"][1]) async for o in s]
    assert int(first["y"][1]) == 1
    assert rest == [2, 3]


async def test_an_error_reaches_only_its_own_request():
    registry, opt = _sleepy_model_parts()
    async with flowrt.Runtime(registry) as rt:
        model = await rt.load(opt, max_in_flight=2)
        async with model.stream() as s:
            await s.send(_req(0.0, 1))
            await s.send(_req(-1.0, 2))
            assert int((await s.__anext__())["y"][1]) == 1
            with pytest.raises(
                RunError, match="layer 'sleep' on backend Sleepy failed: ValueError: negative delay"
            ):
                await s.__anext__()
            await s.send(_req(0.0, 3))
            s.close()
            assert [int(o["y"][1]) async for o in s] == [3]


async def test_submit_returns_outputs_directly():
    registry, opt = _sleepy_model_parts()
    async with flowrt.Runtime(registry) as rt:
        model = await rt.load(opt, max_in_flight=2)
        async with model.stream() as s:
            results = {}

            async def ask(tag):
                results[tag] = int((await s.submit(_req(0.01, tag)))["y"][1])

            async with trio.open_nursery() as nursery:
                for tag in range(5):
                    nursery.start_soon(ask, tag)
    assert results == {tag: tag for tag in range(5)}


async def test_leaving_the_stream_early_cancels_runs_and_returns_every_pool():
    registry, opt = _sleepy_model_parts()
    async with flowrt.Runtime(registry, cpu_workers=2) as rt:
        model = await rt.load(opt, max_in_flight=3)
        with trio.fail_after(5):
            async with model.stream(max_in_flight=3) as s:
                for tag in range(3):
                    await s.send(_req(0.05, tag))
        assert model.pools.free_count == 3
        with pytest.raises(FlowrtError, match="the stream is closed"):
            await s.send(_req(0.0, 9))
        assert int((await model.run(_req(0.0, 7)))["y"][1]) == 7


@pytest.mark.parametrize("attempt", range(200))
async def test_cancelling_a_send_or_the_stream_scope_leaves_nothing_behind(attempt):
    registry, opt = _sleepy_model_parts()
    async with flowrt.Runtime(registry, cpu_workers=2) as rt:
        model = await rt.load(opt, max_in_flight=1)
        with trio.move_on_after(0.001 * (attempt % 7)):
            async with model.stream(max_in_flight=1) as s:
                await s.send(_req(0.002, 0))
                await s.send(_req(0.0, 1))  # blocks: the stream is full until the first is received
        assert model.pools.free_count == 1
        assert int((await model.run(_req(0.0, 5)))["y"][1]) == 5


# -- dynamic batching ---------------------------------------------------------------------
def _batchable_parts(backend):
    """x (1, 2) -> Relu -> y on ``backend`` (registered as "B"), which sees each batch run."""
    registry = BackendRegistry()
    registry.register("B", lambda: backend)
    net = flowrt.Network()
    x = net.add_input("x", TensorInfo((1, 2)))
    net.add_output("y", net.add_layer("Relu", inputs=[x], name="relu"))
    return registry, flowrt.optimize(net, backends=["B"], registry=registry)


def _row(tag: float) -> dict:
    return {"x": np.array([[0.0, tag]], np.float32)}


async def test_requests_within_max_delay_are_stacked_and_split_back_in_order(autojump_clock):
    backend = PartialBackend("B", {"Relu"})
    registry, opt = _batchable_parts(backend)
    async with flowrt.Runtime(registry, cpu_workers=2) as rt:
        model = await rt.load(opt, max_in_flight=2)
        async with model.stream(max_batch=4, max_delay=1.0) as s:

            async def produce():
                for at, tag in [(0.0, 0), (0.5, 1), (1.2, 2), (3.0, 3), (3.0, 4), (3.0, 5)]:
                    await trio.sleep_until(at)
                    await s.send(_row(tag))
                s.close()

            async with trio.open_nursery() as nursery:
                nursery.start_soon(produce)
                received = [o["y"] async for o in s]
    # 0 and 1 arrive within 1 s of 0; 2 waits its 1 s alone; 3-5 run as one, padded to 4.
    # (Two workers: a batch may start executing before the one sent ahead of it.)
    batches = sorted(seen[0][:, 1].tolist() for seen in backend.inputs_seen)
    assert batches == [[0, 1], [2], [3, 4, 5, 5]]
    assert s.batch_counts == {2: 1, 1: 1, 3: 1}  # requests per batch, padding not counted
    assert [r.shape for r in received] == [(1, 2)] * 6
    assert [int(r[0, 1]) for r in received] == [0, 1, 2, 3, 4, 5]


async def test_a_full_batch_runs_without_waiting_for_max_delay(autojump_clock):
    backend = PartialBackend("B", {"Relu"})
    registry, opt = _batchable_parts(backend)
    async with flowrt.Runtime(registry, cpu_workers=2) as rt:
        model = await rt.load(opt, max_in_flight=2)
        async with model.stream(max_batch=2, max_delay=60.0) as s:
            start = trio.current_time()
            results = {}

            async def ask(tag):
                results[tag] = int((await s.submit(_row(tag)))["y"][0, 1])

            async with trio.open_nursery() as nursery:
                for tag in range(2):
                    nursery.start_soon(ask, tag)
            assert trio.current_time() - start < 60.0
    assert results == {0: 0, 1: 1}
    assert [seen[0].shape for seen in backend.inputs_seen] == [(2, 2)]


async def test_a_hinted_stream_runs_a_lone_request_without_waiting_for_a_batch(autojump_clock):
    backend = PartialBackend("B", {"Relu"})
    registry, opt = _batchable_parts(backend)
    async with flowrt.Runtime(registry, cpu_workers=2) as rt:
        model = await rt.load(opt, max_in_flight=1)
        # costs where batches pay: batch 4, max_delay a quarter of a lone run (10 s)
        model.measured_costs = hints.Costs(40.0, {1: 40.0, 2: 16.0, 4: 8.0})
        async with model.stream() as s:  # no arguments: the throughput hint
            assert (s.max_batch, s.max_delay, s.starts_when_idle) == (4, 10.0, True)
            start = trio.current_time()
            assert int((await s.submit(_row(0)))["y"][0, 1]) == 0
            assert trio.current_time() - start < 10.0  # nothing else ran: it started at once
        async with model.stream(hint="throughput", max_delay=10.0) as s:
            assert not s.starts_when_idle  # a delay given is Triton's queue delay
            start = trio.current_time()
            assert int((await s.submit(_row(1)))["y"][0, 1]) == 1
            assert trio.current_time() - start >= 10.0
    assert [seen[0].shape for seen in backend.inputs_seen] == [(1, 2), (1, 2)]


async def test_requests_that_wait_for_a_free_run_join_one_batch():
    """As Triton's dynamic batcher: a batch is formed when a run can start. While the model's
    one run in flight waits for the only worker, the requests behind it queue, and they leave
    together when it ends, though ``max_delay`` is long past; not each in a batch of its own."""
    backend = PartialBackend("B", {"Relu"})
    registry, opt = _batchable_parts(backend)
    async with flowrt.Runtime(registry, cpu_workers=1) as rt:
        model = await rt.load(opt, max_in_flight=1)
        async with model.stream(max_batch=4, max_delay=0.0) as s, trio.open_nursery() as nursery:
            gate = threading.Event()  # another model's job holds the worker until it is set
            nursery.start_soon(rt._workers.run_sync, gate.wait, 30)  # type: ignore[union-attr]
            await s.send(_row(0))
            await trio.testing.wait_all_tasks_blocked()  # 0 left alone: its run waits
            for tag in range(1, 4):
                await s.send(_row(tag))
            await trio.testing.wait_all_tasks_blocked()
            assert backend.inputs_seen == []
            gate.set()
            s.close()
            received = [int(o["y"][0, 1]) async for o in s]
    assert [seen[0][:, 1].tolist() for seen in backend.inputs_seen] == [[0], [1, 2, 3, 3]]
    assert received == [0, 1, 2, 3]


async def test_a_failing_batch_fails_each_of_its_requests_and_a_bad_feed_fails_alone():
    backend = PartialBackend("B", {"Relu"}, fail_kinds={"Relu"})
    registry, opt = _batchable_parts(backend)
    async with flowrt.Runtime(registry, cpu_workers=2) as rt:
        model = await rt.load(opt, max_in_flight=2)
        async with model.stream(max_batch=2, max_delay=0.0) as s:
            s.send_nowait({"x": np.zeros((1, 3), np.float32)})
            s.send_nowait(_row(1))
            s.send_nowait(_row(2))
            s.close()
            with pytest.raises(ShapeError, match=r"input 'x' expects shape \(1, 2\), got \(1, 3\)"):
                await s.__anext__()
            for _ in range(2):
                with pytest.raises(RunError, match="layer 'relu' on backend B failed"):
                    await s.__anext__()
    assert [seen[0].shape for seen in backend.inputs_seen] == [(2, 2)]


async def test_a_model_that_cannot_be_rebatched_refuses_a_batching_stream():
    registry, _ = _batchable_parts(PartialBackend("B", {"Relu", "Reshape"}))
    net = flowrt.Network()
    x = net.add_input("x", TensorInfo((1, 4)))
    net.add_output("y", net.add_layer("Reshape", inputs=[x, np.array([2, 2], np.int64)], name="fold"))
    async with flowrt.Runtime(registry) as rt:
        model = await rt.load(flowrt.optimize(net, backends=["B"], registry=registry))
        with pytest.raises(
            ShapeError, match=r"cannot batch output 'y': its axis 0 holds 2 rows of each sample"
        ):
            model.stream(max_batch=4)
        assert isinstance(model.stream(max_batch=1), flowrt.stream.Stream)


async def test_leaving_a_batching_stream_fails_the_request_held_while_a_batch_waits_for_a_pool():
    registry, opt = _sleepy_model_parts((1, 2))
    async with flowrt.Runtime(registry, cpu_workers=2) as rt:
        model = await rt.load(opt, max_in_flight=1)
        outcomes = {}
        with trio.fail_after(5):  # the held request's caller would wait here for ever
            async with trio.open_nursery() as outer:
                with trio.move_on_after(0.05):
                    async with model.stream(max_batch=2, max_delay=0) as s:

                        async def ask(tag, delay):
                            try:
                                outcomes[tag] = await s.submit({"x": np.array([[delay, tag]], np.float32)})
                            except FlowrtError as e:
                                outcomes[tag] = e

                        outer.start_soon(ask, 0, 0.5)  # runs alone, holding the only pool
                        await trio.sleep(0.01)
                        outer.start_soon(ask, 1, 0.0)  # its batch is formed, then waits for the pool
                        await trio.sleep(0.01)
        assert sorted(outcomes) == [0, 1]
        assert isinstance(outcomes[1], FlowrtError)
        assert "closed before this request finished" in str(outcomes[1])
        assert model.pools.free_count == 1


@pytest.mark.parametrize("attempt", range(20))
async def test_leaving_a_batching_stream_early_returns_every_pool_and_fails_waiters(attempt):
    registry, opt = _sleepy_model_parts((1, 2))
    async with flowrt.Runtime(registry, cpu_workers=2) as rt:
        model = await rt.load(opt, max_in_flight=1)
        outcomes, started = [], 0
        with trio.fail_after(5):  # a waiter left hanging would fail here
            async with trio.open_nursery() as outer:
                with trio.move_on_after(0.002 * (attempt % 5)):
                    async with model.stream(max_batch=2, max_delay=0.001) as s:

                        async def ask(tag):
                            try:
                                outcomes.append(await s.submit({"x": np.array([[0.003, tag]], np.float32)}))
                            except FlowrtError as e:
                                outcomes.append(e)

                        for tag in range(3):
                            outer.start_soon(ask, tag)
                        started = 3
                        await trio.sleep(0.001 * (attempt % 4))
        assert len(outcomes) == started
        assert all(isinstance(o, FlowrtError) or int(o["y"][0, 1]) in (0, 1, 2) for o in outcomes)
        pair = await model.batched(2)
        assert (model.pools.free_count, pair.pools.free_count) == (1, 1)
        assert int((await pair.run({"x": np.array([[0, 5], [0, 6]], np.float32)}))["y"][1, 1]) == 6
