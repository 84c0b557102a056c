"""Closing a stream wakes every task that waits on it, inside its ``async with`` or not, as a
closed trio channel would: model streams, batching streams and pipeline streams alike."""

import threading

import numpy as np
import pytest
import trio
from fakes import SleepyBackend
from trio.testing import wait_all_tasks_blocked

import flowrt
from flowrt.errors import FlowrtError, StreamClosedError
from flowrt.registry import BackendRegistry
from flowrt.types import TensorInfo

KINDS = ["model", "batching", "pipeline"]


class _GatedWorkload:
    def __init__(self, gate: threading.Event) -> None:
        self.gate = gate

    def prepare(self) -> None:
        pass

    def execute(self, inputs):
        if not self.gate.wait(timeout=30):
            raise TimeoutError("the test never opened the gate")
        return [inputs[0].copy()]


class _GatedBackend(SleepyBackend):
    """Runs Identity-like "Relu" layers that hold their worker until ``gate`` is set: a run
    that is still running when the test says so, however loaded the machine."""

    id = "Gated"

    def __init__(self, gate: threading.Event) -> None:
        self.gate = gate

    def create_workload_factory(self, memory_manager):
        gate = self.gate
        return type("GatedFactory", (), {"create_workload": lambda self, info: _GatedWorkload(gate)})()


def _gated_model(gate: threading.Event | None = None):
    """x (1, 2) -> y, each run held until ``gate`` is set (no gate: runs at once)."""
    if gate is None:
        gate = threading.Event()
        gate.set()
    registry = BackendRegistry()
    registry.register("Gated", lambda: _GatedBackend(gate))
    net = flowrt.Network()
    x = net.add_input("x", TensorInfo((1, 2)))
    net.add_output("y", net.add_layer("Relu", inputs=[x], name="gated"))
    return registry, flowrt.optimize(net, backends=["Gated"], registry=registry)


async def _open_gate_once_all_wait(gate: threading.Event) -> None:
    """Start last in a block: the block's end has cancelled the held runs by the time every
    task waits, and they then end (cancelled) with the gate open."""
    await wait_all_tasks_blocked()
    gate.set()


def _req(tag: float) -> dict:
    return {"x": np.array([[0.0, tag]], np.float32)}


def _tag(outputs) -> int:
    return int(outputs["y"][0, 1])


def _open(kind: str, model, max_in_flight: int):
    if kind == "model":
        return model.stream(max_in_flight=max_in_flight)
    if kind == "batching":
        return model.stream(max_in_flight=max_in_flight, max_batch=2, max_delay=0)
    return flowrt.Pipeline([model]).stream(max_in_flight=max_in_flight)


async def _wait_and_record(outcome: dict, wait) -> None:
    try:
        outcome["value"] = await wait()
    except FlowrtError as e:
        outcome["error"] = e


@pytest.mark.parametrize("operation", ["send", "submit"])
@pytest.mark.parametrize("kind", KINDS)
async def test_a_send_waiting_for_room_wakes_with_stream_closed_when_close_is_called(kind, operation):
    registry, opt = _gated_model()
    async with flowrt.Runtime(registry, cpu_workers=2) as rt:
        model = await rt.load(opt, max_in_flight=1)
        outcome: dict = {}
        with trio.fail_after(10):  # without the fix the waiting send never wakes
            async with _open(kind, model, 1) as s, trio.open_nursery() as nursery:
                s.send_nowait(_req(0))  # full until received
                nursery.start_soon(_wait_and_record, outcome, lambda: getattr(s, operation)(_req(1)))
                await wait_all_tasks_blocked()
                s.close()
                received = [_tag(o) async for o in s]
        assert model.pools.free_count == 1
    error = outcome["error"]
    assert isinstance(error, StreamClosedError) and isinstance(error, trio.ClosedResourceError)
    assert f"was closed while this {operation} waited for room (1 requests in flight" in str(error)
    assert received == [0]  # what was sent before close() is still delivered


@pytest.mark.parametrize("operation", ["send", "submit"])
@pytest.mark.parametrize("kind", KINDS)
async def test_a_send_outside_the_block_waiting_for_room_wakes_when_the_block_ends(kind, operation):
    registry, opt = _gated_model()
    async with flowrt.Runtime(registry, cpu_workers=2) as rt:
        model = await rt.load(opt, max_in_flight=1)
        outcome: dict = {}
        with trio.fail_after(10):
            async with trio.open_nursery() as outer:
                async with _open(kind, model, 1) as s:
                    s.send_nowait(_req(0))
                    outer.start_soon(_wait_and_record, outcome, lambda: getattr(s, operation)(_req(1)))
                    await wait_all_tasks_blocked()
        assert model.pools.free_count == 1
    assert isinstance(outcome["error"], StreamClosedError)
    assert f"closed while this {operation} waited for room" in str(outcome["error"])


@pytest.mark.parametrize("kind", KINDS)
async def test_receivers_outside_the_block_with_nothing_sent_end_their_iteration_when_it_ends(kind):
    registry, opt = _gated_model()
    async with flowrt.Runtime(registry) as rt:
        model = await rt.load(opt, max_in_flight=1)
        received: list[list] = []

        async def receive(s):
            received.append([o async for o in s])

        with trio.fail_after(10):
            async with trio.open_nursery() as outer:
                async with _open(kind, model, 1) as s:
                    outer.start_soon(receive, s)
                    outer.start_soon(receive, s)  # two receivers: both wake
                    await wait_all_tasks_blocked()
    assert received == [[], []]


@pytest.mark.parametrize("kind", KINDS)
async def test_two_receivers_waiting_for_a_request_both_wake_at_close(kind):
    registry, opt = _gated_model()
    async with flowrt.Runtime(registry) as rt:
        model = await rt.load(opt, max_in_flight=1)
        received: list[int] = []

        async def receive(s):
            received.extend([_tag(o) async for o in s])

        with trio.fail_after(10):
            async with _open(kind, model, 1) as s, trio.open_nursery() as nursery:
                nursery.start_soon(receive, s)
                nursery.start_soon(receive, s)
                await wait_all_tasks_blocked()
                await s.send(_req(4))
                s.close()
    assert received == [4]  # delivered once, and neither receiver left waiting


@pytest.mark.parametrize("kind", KINDS)
async def test_a_receiver_outside_the_block_waiting_for_a_running_request_gets_stream_closed(kind):
    gate = threading.Event()
    registry, opt = _gated_model(gate)
    async with flowrt.Runtime(registry, cpu_workers=2) as rt:
        model = await rt.load(opt, max_in_flight=1)
        outcome: dict = {}
        with trio.fail_after(10):
            async with trio.open_nursery() as outer:
                async with _open(kind, model, 1) as s:
                    outer.start_soon(_wait_and_record, outcome, s.__anext__)
                    await s.send(_req(0))
                    await wait_all_tasks_blocked()  # its run holds a worker; the receiver waits
                    outer.start_soon(_open_gate_once_all_wait, gate)
            with pytest.raises(StopAsyncIteration):
                await s.__anext__()  # the failed request was received: nothing is left
        assert model.pools.free_count == 1
    assert isinstance(outcome["error"], StreamClosedError)
    assert "closed before this request finished: its 'async with' ended" in str(outcome["error"])


@pytest.mark.parametrize("kind", KINDS)
async def test_a_submit_outside_the_block_still_running_when_it_ends_gets_stream_closed(kind):
    gate = threading.Event()
    registry, opt = _gated_model(gate)
    async with flowrt.Runtime(registry, cpu_workers=2) as rt:
        model = await rt.load(opt, max_in_flight=1)
        outcome: dict = {}
        with trio.fail_after(10):
            async with trio.open_nursery() as outer:
                async with _open(kind, model, 1) as s:
                    outer.start_soon(_wait_and_record, outcome, lambda: s.submit(_req(0)))
                    await wait_all_tasks_blocked()  # its run holds a worker
                    outer.start_soon(_open_gate_once_all_wait, gate)
        assert model.pools.free_count == 1
    assert isinstance(outcome["error"], StreamClosedError)
    assert "closed before this request finished" in str(outcome["error"])


async def test_results_finished_before_the_block_ended_are_still_received_after_it():
    pipeline = flowrt.Pipeline([lambda v: {"i": v["i"] * 10}])
    async with pipeline.stream(max_in_flight=3) as s:
        for i in range(3):
            await s.send({"i": i})
        await wait_all_tasks_blocked()  # a sync stage: every request has gone through
    with trio.fail_after(10):
        assert [o["i"] async for o in s] == [0, 10, 20]


@pytest.mark.parametrize("kind", KINDS)
async def test_a_closed_stream_refuses_sends_and_reopening(kind):
    registry, opt = _gated_model()
    async with flowrt.Runtime(registry) as rt:
        model = await rt.load(opt, max_in_flight=1)
        stream = _open(kind, model, 1)
        with pytest.raises(FlowrtError, match="is not open yet: send within its 'async with'"):
            stream.send_nowait(_req(0))
        async with stream as s:
            pass
        with pytest.raises(trio.ClosedResourceError, match="is closed: send within its 'async with'"):
            await s.send(_req(0))
        with pytest.raises(StreamClosedError, match="was opened before: make a new one"):
            async with s:
                pass
