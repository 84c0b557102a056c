"""Backend contexts' load hooks, Runtime.unload, and user allocators."""

from typing import Any

import numpy as np
import pytest
import trio
from fakes import PartialBackend

import flowrt
from flowrt.engine.memory.allocator import HostAllocator
from flowrt.errors import BackendError, FlowrtError, InputError
from flowrt.registry import BackendRegistry
from flowrt.types import TensorInfo


class RecordingContext:
    def __init__(self, calls: list) -> None:
        self.calls = calls

    def __getattr__(self, hook: str) -> Any:
        if hook not in ("before_load", "after_load", "before_unload", "after_unload"):
            raise AttributeError(hook)
        return lambda network_id: self.calls.append((hook, network_id))


class ContextBackend(PartialBackend):
    def __init__(self, calls: list) -> None:
        super().__init__("Recorder", {"Relu", "Add"})
        self.recorded = calls

    def create_context(self, options: Any) -> RecordingContext:
        return RecordingContext(self.recorded)


def network() -> flowrt.Network:
    net = flowrt.Network()
    x = net.add_input("x", TensorInfo((2, 3)))
    add = net.add_layer("Add", inputs=[x, np.full((2, 3), -1, np.float32)], name="add")
    net.add_output("y", net.add_layer("Relu", inputs=[add], name="relu"))
    return net


X = np.arange(6, dtype=np.float32).reshape(2, 3)


async def test_hooks_are_called_with_the_network_id_around_load_and_unload():
    calls: list = []
    registry = BackendRegistry()
    registry.register("Recorder", lambda: ContextBackend(calls))
    opt = flowrt.optimize(network(), backends=["Recorder"], registry=registry)
    async with flowrt.Runtime(registry, cpu_workers=1) as rt:
        first = await rt.load(opt, max_in_flight=1)
        second = await rt.load(opt, max_in_flight=1)
        np.testing.assert_array_equal((await first.run({"x": X}))["y"], np.maximum(X - 1, 0))
        await rt.unload(first)
        assert calls == [
            ("before_load", 0),
            ("after_load", 0),
            ("before_load", 1),
            ("after_load", 1),
            ("before_unload", 0),
            ("after_unload", 0),
        ]
        with pytest.raises(FlowrtError, match="network 0 was unloaded"):
            await first.run({"x": X})
        assert first.pools.count == 0
        with pytest.raises(FlowrtError, match="network 0 is unloaded"):
            await first.unload()
    assert calls[-2:] == [("before_unload", 1), ("after_unload", 1)]  # the runtime's close
    assert second.unloaded


class CountingAllocator(HostAllocator):
    def __init__(self) -> None:
        self.sizes: list[int] = []

    def allocate(self, nbytes: int) -> np.ndarray:
        self.sizes.append(nbytes)
        return super().allocate(nbytes)


def deeper_network() -> flowrt.Network:
    net = network()
    relu = net.graph.layers["relu"]
    (output,) = net.graph.output_layers
    tanh = net.graph.add_layer("Tanh", name="tanh")
    relu.outputs[0].disconnect(output.inputs[0])
    relu.outputs[0].connect(tanh.inputs[0])
    tanh.outputs[0].connect(output.inputs[0])
    return net


async def test_cpuacc_takes_its_arenas_from_a_user_allocator():
    allocator = CountingAllocator()
    opt = flowrt.optimize(deeper_network(), backends=["CpuAcc"])
    async with flowrt.Runtime(cpu_workers=1, allocators={"CpuAcc": allocator}) as rt:
        got = await (await rt.load(opt, max_in_flight=2)).run({"x": X})
    # one pool made at load: a second one only when two runs are in flight at once
    assert len(allocator.sizes) == 1 and allocator.sizes[0] >= 2 * 3 * 4
    np.testing.assert_allclose(got["y"], np.tanh(np.maximum(X - 1, 0)), rtol=1e-6)


async def test_a_pool_made_when_runs_first_need_it_comes_from_the_user_allocator_too():
    allocator = CountingAllocator()
    opt = flowrt.optimize(deeper_network(), backends=["CpuAcc"])
    results = []
    async with flowrt.Runtime(cpu_workers=1, allocators={"CpuAcc": allocator}) as rt:
        model = await rt.load(opt, max_in_flight=2)

        async def run() -> None:
            results.append(await model.run({"x": X}))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(run)
            nursery.start_soon(run)
    assert len(allocator.sizes) == 2 and allocator.sizes[1] == allocator.sizes[0]
    for result in results:
        np.testing.assert_allclose(result["y"], np.tanh(np.maximum(X - 1, 0)), rtol=1e-6)


@pytest.mark.parametrize(
    "allocators, error, message",
    [
        ({"Nope": HostAllocator()}, BackendError, "names backend 'Nope', which is not registered"),
        ({"GpuAcc": HostAllocator()}, BackendError, "capabilities do not allow a custom allocator"),
        ({"CpuAcc": object()}, InputError, r"allocators\['CpuAcc'\]: expected an Allocator"),
    ],
)
def test_a_bad_allocator_is_a_clear_error(allocators, error, message):
    with pytest.raises(error, match=message):
        flowrt.Runtime(allocators=allocators)
