"""Host segments bound to a memory pool: chains of small CpuAcc layers run as one step, with
the results the layers give one by one, on every pool and every run."""

import numpy as np
import trio

import flowrt
from flowrt.engine.scheduler.binding import BoundStep
from flowrt.types import TensorInfo


def chain_network(width: int = 8) -> flowrt.Network:
    """x -> Add c -> Relu -> Mul c -> Reshape -> Sigmoid -> Sub c -> LeakyRelu -> y."""
    rng = np.random.default_rng(0)
    const = [rng.uniform(-1, 1, (1, width)).astype(np.float32) for _ in range(3)]
    net = flowrt.Network()
    x = net.add_input("x", TensorInfo((2, width)))
    layer = net.add_layer("Add", inputs=[x, const[0]], name="add")
    layer = net.add_layer("Relu", inputs=[layer], name="relu")
    layer = net.add_layer("Mul", inputs=[layer, const[1]], name="mul")
    layer = net.add_layer("Reshape", inputs=[layer, np.array([width, 2], np.int64)], name="reshape")
    layer = net.add_layer("Sigmoid", inputs=[layer], name="sigmoid")
    layer = net.add_layer("Reshape", inputs=[layer, np.array([2, width], np.int64)], name="back")
    layer = net.add_layer("Sub", inputs=[layer, const[2]], name="sub")
    layer = net.add_layer("LeakyRelu", flowrt.descriptors.LeakyRelu(alpha=0.3), inputs=[layer], name="leaky")
    net.add_output("y", layer)
    return net


def _steps(model) -> list:
    return [step for pool in model.pools.pools for steps in pool.programs.values() for step in steps]


async def test_chain_runs_as_one_bound_step_with_cpurefs_results():
    feeds = [{"x": np.random.default_rng(i).standard_normal((2, 8)).astype(np.float32)} for i in range(4)]
    async with flowrt.Runtime(cpu_workers=1) as rt:
        ref = await rt.load(flowrt.optimize(chain_network(), backends=["CpuRef"]))
        acc = await rt.load(flowrt.optimize(chain_network(), backends=["CpuAcc"]), max_in_flight=2)
        for f in feeds:
            expected = (await ref.run(f))["y"]
            got = (await acc.run(f))["y"]
            np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-7)
        steps = _steps(acc)
        (segment,) = acc.dataflow.segments
    # The Add (with its Relu fused) reads the feed, which changes from run to run: it runs on
    # its own; the rest of the chain is one step (in the one pool that runs one at a time use).
    assert [type(s) for s in steps] == [type(segment.nodes[0]), BoundStep]
    assert [n.layer for n in steps[1].nodes] == [n.layer for n in segment.nodes[1:]]


async def test_concurrent_runs_on_two_pools_each_get_their_own_results():
    net = chain_network()
    xs = [np.full((2, 8), v, np.float32) for v in np.linspace(-2, 2, 8)]
    async with flowrt.Runtime(cpu_workers=2) as rt:
        ref = await rt.load(flowrt.optimize(net, backends=["CpuRef"]))
        acc = await rt.load(flowrt.optimize(net, backends=["CpuAcc"]), max_in_flight=2)
        expected = [(await ref.run({"x": x}))["y"] for x in xs]
        got: list = [None] * len(xs)

        async def one(i):
            got[i] = (await acc.run({"x": xs[i]}))["y"]

        for _ in range(3):
            async with trio.open_nursery() as nursery:
                for i in range(len(xs)):
                    nursery.start_soon(one, i)
            for g, e in zip(got, expected):
                np.testing.assert_allclose(g, e, rtol=1e-6, atol=1e-7)
        assert len({id(step) for step in _steps(acc) if isinstance(step, BoundStep)}) == 2


async def test_profiled_runs_time_every_layer_and_agree_with_bound_runs():
    x = np.random.default_rng(3).standard_normal((2, 8)).astype(np.float32)
    async with flowrt.Runtime(cpu_workers=1) as rt:
        model = await rt.load(flowrt.optimize(chain_network(), backends=["CpuAcc"]))
        bound = (await model.run({"x": x}))["y"]
        profiled = (await model.run({"x": x}, profile=True))["y"]
        layers = {record.layer for record in model.profile()}
    np.testing.assert_array_equal(bound, profiled)
    assert {"add", "mul", "sigmoid", "sub"} <= layers
