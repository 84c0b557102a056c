"""A huge ``max_in_flight`` costs only the memory pools that runs in flight at once use: the
first ``EAGER_POOLS`` pools are made at load, the rest when runs first need them, and all of
them are held to the memory budget at load (ResourceError naming max_in_flight and the bytes)."""

import numpy as np
import pytest
import trio

import flowrt
from flowrt.engine.memory.pool import EAGER_POOLS
from flowrt.errors import ResourceError
from flowrt.types import TensorInfo

X = np.linspace(-1, 1, 4, dtype=np.float32).reshape(1, 4)


def _relu_tanh() -> flowrt.OptimizedNetwork:
    """x (1, 4) -> Relu -> Tanh -> y: one intermediate tensor, so each pool has an arena."""
    net = flowrt.Network()
    relu = net.add_layer("Relu", inputs=[net.add_input("x", TensorInfo((1, 4)))], name="relu")
    net.add_output("y", net.add_layer("Tanh", inputs=[relu], name="tanh"))
    return flowrt.optimize(net, backends=["CpuRef"])


async def test_a_huge_max_in_flight_makes_pools_only_as_runs_need_them():
    async with flowrt.Runtime(cpu_workers=2) as rt:
        with trio.fail_after(10):  # a million pools made at load took seconds and 1.5 GiB
            model = await rt.load(_relu_tanh(), max_in_flight=10**6)
        assert model.pools.count == 10**6 and len(model.pools.pools) == EAGER_POOLS
        results = []

        async def run() -> None:
            results.append((await model.run({"x": X}))["y"])

        async with trio.open_nursery() as nursery:
            for _ in range(EAGER_POOLS + 36):
                nursery.start_soon(run)
        assert len(model.pools.pools) <= EAGER_POOLS + 36
        assert model.pools.free_count == model.pools.count  # every pool given back
        for got in results:
            np.testing.assert_allclose(got, np.tanh(np.maximum(X, 0)), rtol=1e-6)


async def test_a_max_in_flight_whose_pools_pass_the_memory_budget_is_refused_naming_it():
    async with flowrt.Runtime(cpu_workers=1, memory_budget=10**6) as rt:
        arena = (await rt.load(_relu_tanh(), max_in_flight=1)).memory_report()["CpuRef"]["arena_bytes"]
        with pytest.raises(ResourceError) as raised:
            await rt.load(_relu_tanh(), max_in_flight=10**6)
    message = str(raised.value)
    assert f"needs {arena * 10**6:,} bytes, over the memory budget of 1,000,000 bytes" in message
    assert "1,000,000 memory pool(s)" in message and "Runtime.load's max_in_flight" in message
