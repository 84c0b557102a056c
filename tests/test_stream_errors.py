"""Errors leave a stream's or a pipeline's ``async with`` as themselves, not wrapped in the
exception group of the stream's nursery; cancellation passes through untouched."""

import traceback

import numpy as np
import pytest
import trio
from fakes import SleepyBackend

import flowrt
from flowrt.errors import FlowrtError, RunError, ShapeError
from flowrt.nursery import open_nursery
from flowrt.registry import BackendRegistry
from flowrt.types import TensorInfo

KINDS = ["model", "batching", "pipeline"]


def _sleepy_model():
    """x (1, 2) -> y on a backend that sleeps x[0, 0] seconds (and fails on a negative one)."""
    registry = BackendRegistry()
    registry.register("Sleepy", SleepyBackend)
    net = flowrt.Network()
    x = net.add_input("x", TensorInfo((1, 2)))
    net.add_output("y", net.add_layer("Relu", inputs=[x], name="sleep"))
    return registry, flowrt.optimize(net, backends=["Sleepy"], registry=registry)


def _req(delay: float, tag: float) -> dict:
    return {"x": np.array([[delay, tag]], np.float32)}


def _open(kind: str, model, max_in_flight: int = 2):
    if kind == "model":
        return model.stream(max_in_flight=max_in_flight)
    if kind == "batching":
        return model.stream(max_in_flight=max_in_flight, max_batch=2, max_delay=0)
    return flowrt.Pipeline([model]).stream(max_in_flight=max_in_flight)


@pytest.mark.parametrize("kind", KINDS)
async def test_a_run_error_received_in_the_block_leaves_it_as_a_run_error(kind):
    registry, opt = _sleepy_model()
    async with flowrt.Runtime(registry) as rt:
        model = await rt.load(opt)
        caught = None
        try:
            async with _open(kind, model) as s:
                await s.send(_req(-1.0, 0))
                await s.__anext__()
        except FlowrtError as e:  # never matched while the error left in an exception group
            caught = e
        assert model.pools.free_count == model.pools.count
    assert isinstance(caught, RunError)
    assert "layer 'sleep' on backend Sleepy failed: ValueError: negative delay" in str(caught)


async def test_a_shape_error_from_submit_leaves_the_block_as_a_shape_error():
    registry, opt = _sleepy_model()
    async with flowrt.Runtime(registry) as rt:
        model = await rt.load(opt)
        with pytest.raises(ShapeError, match=r"input 'x' expects shape \(1, 2\), got \(1, 3\)"):
            async with model.stream() as s:
                await s.submit({"x": np.zeros((1, 3), np.float32)})


def _raise_key_error():
    try:
        raise ValueError("the cause")
    except ValueError as cause:
        raise KeyError("missing") from cause


@pytest.mark.parametrize("kind", KINDS)
async def test_a_user_error_in_the_block_leaves_it_as_itself_with_its_cause_and_traceback(kind):
    registry, opt = _sleepy_model()
    async with flowrt.Runtime(registry) as rt:
        model = await rt.load(opt)
        with pytest.raises(KeyError, match="missing") as info:
            async with _open(kind, model) as s:
                await s.send(_req(0.0, 0))
                _raise_key_error()
    assert type(info.value) is KeyError
    assert isinstance(info.value.__cause__, ValueError) and str(info.value.__cause__) == "the cause"
    frames = [frame.name for frame in traceback.extract_tb(info.value.__traceback__)]
    assert "_raise_key_error" in frames


@pytest.mark.parametrize("kind", KINDS)
async def test_cancelling_around_the_block_passes_through_untouched(kind):
    registry, opt = _sleepy_model()
    async with flowrt.Runtime(registry) as rt:
        model = await rt.load(opt)
        with trio.move_on_after(0.05) as scope:
            async with _open(kind, model) as s:
                await s.send(_req(0.0, 0))
                await trio.sleep_forever()
        assert scope.cancelled_caught
        assert model.pools.free_count == model.pools.count


@pytest.mark.parametrize("kind", KINDS)
async def test_a_keyboard_interrupt_in_the_block_leaves_it_bare(kind):
    registry, opt = _sleepy_model()
    async with flowrt.Runtime(registry) as rt:
        model = await rt.load(opt)
        with pytest.raises(KeyboardInterrupt) as info:
            async with _open(kind, model) as s:
                await s.send(_req(0.0, 0))
                raise KeyboardInterrupt
    assert type(info.value) is KeyboardInterrupt


async def test_a_group_raised_by_the_users_own_nursery_keeps_its_one_layer():
    pipeline = flowrt.Pipeline([lambda v: v])
    with pytest.raises(ExceptionGroup) as info:
        async with pipeline.stream() as s, trio.open_nursery():
            await s.send({"i": 1})
            raise KeyError("inner")
    assert [type(e) for e in info.value.exceptions] == [KeyError]


# -- the rule for several errors (flowrt.nursery) -------------------------------------------
async def _fail(error: BaseException) -> None:
    raise error


async def test_several_errors_leave_as_the_first_flowrt_error_with_the_others_as_notes():
    error = RunError("conv", "CpuRef", ValueError("bad"))
    with pytest.raises(RunError) as info:
        async with open_nursery() as nursery:
            nursery.start_soon(_fail, error)
            nursery.start_soon(_fail, KeyError("other"))
    assert info.value is error
    assert info.value.__notes__ == ["raised in the same 'async with' too: KeyError: 'other'"]


async def test_several_errors_without_a_flowrt_error_or_beside_an_interrupt_stay_a_group():
    for second in (KeyError("other"), KeyboardInterrupt()):
        with pytest.raises(BaseExceptionGroup) as info:
            async with open_nursery() as nursery:
                nursery.start_soon(_fail, ValueError("one"))
                nursery.start_soon(_fail, second)
        assert {type(e) for e in info.value.exceptions} == {ValueError, type(second)}
