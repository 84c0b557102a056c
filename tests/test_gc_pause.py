"""The cyclic garbage collector paused over import, optimize and load (gc_pause.py)."""

from __future__ import annotations

import gc
import threading

import numpy as np
import pytest

import flowrt
from flowrt import gc_pause
from flowrt.engine.graph import optimizer
from flowrt.types import TensorInfo


@pytest.fixture
def collector_on():
    was = gc.isenabled()
    gc.enable()
    yield
    if not was:
        gc.disable()


def _net() -> flowrt.Network:
    net = flowrt.Network()
    x = net.add_input("x", TensorInfo((1, 4)))
    net.add_output("y", net.add_layer("Add", inputs=[x, np.ones((1, 4), np.float32)]))
    return net


def test_optimize_runs_with_the_collector_paused_and_enables_it_again(collector_on, monkeypatch):
    seen = []
    passes = optimizer._graph_passes

    def spy(*args):
        seen.append(gc.isenabled())
        return passes(*args)

    monkeypatch.setattr(optimizer, "_graph_passes", spy)
    flowrt.optimize(_net(), backends=["CpuRef"])
    assert seen == [False]
    assert gc.isenabled()


def test_an_error_inside_enables_the_collector_again(collector_on):
    with pytest.raises(flowrt.errors.BackendError):
        flowrt.optimize(_net(), backends=["NoSuchBackend"])
    assert gc.isenabled()


def test_a_collector_the_caller_disabled_stays_disabled(collector_on):
    gc.disable()
    flowrt.optimize(_net(), backends=["CpuRef"])
    assert not gc.isenabled()


def test_overlapping_pauses_enable_it_when_the_last_ends(collector_on):
    entered, leave = threading.Event(), threading.Event()

    def other() -> None:
        with gc_pause.collection_paused():
            entered.set()
            leave.wait(10)

    thread = threading.Thread(target=other)
    with gc_pause.collection_paused():
        thread.start()
        assert entered.wait(10)
    assert not gc.isenabled()  # the other thread's pause is still on
    leave.set()
    thread.join(10)
    assert gc.isenabled()


async def test_a_load_runs_with_the_collector_paused(collector_on, monkeypatch):
    from flowrt import runtime

    seen = []
    build = runtime.build_dataflow

    def spy(*args, **kwargs):
        seen.append(gc.isenabled())
        return build(*args, **kwargs)

    monkeypatch.setattr(runtime, "build_dataflow", spy)
    async with flowrt.Runtime() as rt:
        model = await rt.load(flowrt.optimize(_net(), backends=["CpuRef"]))
        out = await model.run({"x": np.zeros((1, 4), np.float32)})
    np.testing.assert_array_equal(out["y"], np.ones((1, 4), np.float32))
    assert seen == [False]
    assert gc.isenabled()
