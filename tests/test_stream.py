"""Streams: ordered results, backpressure, errors per request, cancellation."""

import numpy as np
import pytest
import trio
import trio.testing
from fakes import SleepyBackend

import flowrt
from flowrt.errors import FlowrtError, ResourceError, RunError
from flowrt.registry import BackendRegistry
from flowrt.types import TensorInfo


def _sleepy_model_parts():
    registry = BackendRegistry()
    registry.register("Sleepy", SleepyBackend)
    net = flowrt.Network()
    x = net.add_input("x", TensorInfo((2,)))
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
