"""Planned memory through the public API: pools per run, isolation, release, reports."""

import random
import resource

import numpy as np
import pytest
import trio
from fakes import PartialBackend

import flowrt
from flowrt.cli import main
from flowrt.errors import DataTypeError, RunError, ShapeError
from flowrt.models import light_model
from flowrt.registry import BackendRegistry
from flowrt.types import TensorInfo
from flowrt.workers.cpu.ref import RefBackend
from flowrt.workers.cpu.ref.kernels import load_all


def _cnn() -> flowrt.Network:
    """conv -> relu -> two branches (conv, reshape view) -> concat: data-dependent outputs."""
    rng = np.random.default_rng(0)
    net = flowrt.Network()
    x = net.add_input("x", TensorInfo((1, 3, 16, 16)))
    c1 = net.add_layer(
        "Conv",
        flowrt.descriptors.Conv(pads=(1, 1, 1, 1)),
        [x, rng.standard_normal((8, 3, 3, 3)).astype(np.float32)],
        name="c1",
    )
    r1 = net.add_layer("Relu", inputs=[c1], name="r1")
    c2 = net.add_layer("Conv", None, [r1, rng.standard_normal((8, 8, 1, 1)).astype(np.float32)], name="c2")
    flat = net.add_layer("Flatten", None, [r1], name="flat")
    back = net.add_layer("Reshape", None, [flat, np.array([1, 8, 16, 16], np.int64)], name="back")
    cat = net.add_layer("Concat", flowrt.descriptors.Concat(axis=1), [c2, back], name="cat")
    net.add_output("y", net.add_layer("Tanh", inputs=[cat], name="out"))
    return net


def _cnn_reference(x: np.ndarray) -> np.ndarray:
    """_cnn() computed with CpuRef's kernels one by one, no planned memory."""
    kernels = load_all()
    layers = {layer.name: layer for layer in _cnn().graph}

    def weights(name):
        return layers[name].inputs[1].source.layer.descriptor.value

    c1 = kernels["Conv"](layers["c1"].descriptor, x, weights("c1"))
    r1 = np.maximum(c1, 0)
    c2 = kernels["Conv"](layers["c2"].descriptor, r1, weights("c2"))
    return np.tanh(np.concatenate([c2, r1], axis=1))


def _input(seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((1, 3, 16, 16)).astype(np.float32)


async def test_concurrent_runs_in_four_pools_match_runs_alone():
    opt = flowrt.optimize(_cnn(), backends=["CpuRef"])
    async with flowrt.Runtime() as rt:
        model = await rt.load(opt, max_in_flight=4)
        alone = {i: (await model.run({"x": _input(i)}))["y"] for i in range(64)}
        together = {}

        async def one(i):
            together[i] = (await model.run({"x": _input(i)}))["y"]

        async with trio.open_nursery() as nursery:
            for i in range(64):
                nursery.start_soon(one, i)
        assert model.pools.free_count == 4
    assert len({a.tobytes() for a in alone.values()}) == 64
    for i in range(64):
        np.testing.assert_array_equal(together[i], alone[i])


async def test_outputs_of_an_earlier_run_are_not_touched_by_the_next():
    async with flowrt.Runtime() as rt:
        model = await rt.load(flowrt.optimize(_cnn(), backends=["CpuRef"]), max_in_flight=1)
        first = (await model.run({"x": _input(1)}))["y"]
        kept = first.copy()
        second = (await model.run({"x": _input(2)}))["y"]
        arenas = list(model.pools.pools[0].arenas.values())  # released when the runtime closes
    np.testing.assert_array_equal(first, kept)
    assert not np.array_equal(first, second)
    for arena in arenas:
        assert not np.shares_memory(first, arena) and not np.shares_memory(second, arena)


async def test_pools_of_in_flight_runs_never_overlap():
    async with flowrt.Runtime() as rt:
        model = await rt.load(flowrt.optimize(_cnn(), backends=["CpuRef"]), max_in_flight=3)
        # one pool is made at load; the others when runs first need them
        assert len(model.pools.pools) == 1
        await model.run({"x": _input(0)})
        assert len(model.pools.pools) == 1  # runs one after another share it
        async with trio.open_nursery() as nursery:
            for seed in range(3):
                nursery.start_soon(model.run, {"x": _input(seed)})
        arenas = [pool.arenas["CpuRef"] for pool in model.pools.pools]
    assert len(arenas) == 3
    for i in range(3):
        for j in range(i + 1, 3):
            assert not np.shares_memory(arenas[i], arenas[j])


def _rss_mib():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize() / 2**20


async def test_cancelled_runs_return_every_pool_and_memory_stays_flat():
    rng = random.Random(0)
    async with flowrt.Runtime() as rt:
        model = await rt.load(
            flowrt.optimize(flowrt.onnx.load(light_model("squeezenet")), backends=["CpuAcc", "CpuRef"]),
            max_in_flight=2,
        )
        x = (np.arange(3 * 224 * 224).reshape(1, 3, 224, 224) / (3 * 224 * 224)).astype(np.float32)
        cancelled = 0
        rss_start = None
        for i in range(150):
            if rng.random() < 1 / 3:
                with trio.move_on_after(rng.uniform(0, 0.005)) as scope:
                    await model.run({"data_0": x})
                cancelled += scope.cancelled_caught
            else:
                await model.run({"data_0": x})
            assert model.pools.free_count == 2
            if i == 49:
                rss_start = _rss_mib()
        assert cancelled > 10
        assert _rss_mib() <= rss_start * 1.05


async def test_pool_returned_when_a_workload_fails():
    registry = BackendRegistry()
    registry.register("CpuRef", RefBackend)
    registry.register("Flaky", lambda: PartialBackend("Flaky", {"Tanh"}, fail_kinds={"Tanh"}))
    async with flowrt.Runtime(registry) as rt:
        model = await rt.load(
            flowrt.optimize(_cnn(), backends=["Flaky", "CpuRef"], registry=registry), max_in_flight=2
        )
        for _ in range(3):
            with pytest.raises(RunError, match="'out' on backend Flaky"):
                await model.run({"x": _input(0)})
        assert model.pools.free_count == 2


async def test_memory_report_gives_arena_no_reuse_and_lower_bound():
    async with flowrt.Runtime() as rt:
        model = await rt.load(flowrt.optimize(_cnn(), backends=["CpuRef"]), max_in_flight=1)
    report = model.memory_report()["CpuRef"]
    tensor = 8 * 16 * 16 * 4
    # c1, r1, cat, out are planned; flat and back are views of r1, and c2 is written straight
    # into its region of cat (a sub-tensor).
    assert report["tensors"] == 4
    assert report["no_reuse_bytes"] == 2 * tensor + 2 * 2 * tensor
    assert report["lower_bound_bytes"] <= report["arena_bytes"] <= report["no_reuse_bytes"]
    assert report["arena_bytes"] < report["no_reuse_bytes"]


async def test_outputs_written_into_caller_arrays():
    async with flowrt.Runtime() as rt:
        model = await rt.load(flowrt.optimize(_cnn(), backends=["CpuRef"]))
        expected = (await model.run({"x": _input(3)}))["y"]
        target = np.empty((1, 16, 16, 16), np.float32)
        result = await model.run({"x": _input(3)}, outputs={"y": target})
        assert result["y"] is target
        np.testing.assert_array_equal(target, expected)
        with pytest.raises(
            ShapeError, match=r"output 'y' has shape \(1, 16, 16, 16\), bound array is \(1, 16\)"
        ):
            await model.run({"x": _input(3)}, outputs={"y": np.empty((1, 16), np.float32)})
        with pytest.raises(DataTypeError, match="output 'y' produces float32, bound array is float64"):
            await model.run({"x": _input(3)}, outputs={"y": np.empty((1, 16, 16, 16))})


async def test_zero_memory_on_release_clears_pools_between_runs():
    for zero in (True, False):
        async with flowrt.Runtime(zero_memory_on_release=zero) as rt:
            model = await rt.load(flowrt.optimize(_cnn(), backends=["CpuRef"]), max_in_flight=1)
            arena = model.pools.pools[0].arenas["CpuRef"]
            arena.fill(0)
            await model.run({"x": _input(4)})
            assert arena.any() != zero


async def test_intermediate_tensors_live_in_the_run_pool():
    spy = PartialBackend("Spy", {"Tanh"})
    registry = BackendRegistry()
    registry.register("CpuRef", RefBackend)
    registry.register("Spy", lambda: spy)
    async with flowrt.Runtime(registry) as rt:
        model = await rt.load(
            flowrt.optimize(_cnn(), backends=["Spy", "CpuRef"], registry=registry), max_in_flight=2
        )
        await model.run({"x": _input(5)})
        arenas = [pool.arenas["CpuRef"] for pool in model.pools.pools]
    (concat_output,) = spy.inputs_seen[0]
    assert sum(np.shares_memory(concat_output, arena) for arena in arenas) == 1


async def test_max_in_flight_must_be_positive():
    async with flowrt.Runtime() as rt:
        with pytest.raises(flowrt.errors.FlowrtError, match="max_in_flight must be a positive int, got 0"):
            await rt.load(flowrt.optimize(_cnn(), backends=["CpuRef"]), max_in_flight=0)


def test_inspect_memory_prints_the_report(capsys):
    assert main(["inspect", str(light_model("resnet50")), "--backends", "CpuRef", "--memory"]) == 0
    out = capsys.readouterr().out
    line = next(line for line in out.splitlines() if line.strip().startswith("CpuRef"))
    arena, no_reuse, lower = (float(v) for v in line.split()[1:4])
    assert lower <= arena < 0.5 * no_reuse


async def test_feeds_are_read_in_place():
    spy = PartialBackend("Spy", {"Relu"})
    registry = BackendRegistry()
    registry.register("Spy", lambda: spy)
    net = flowrt.Network()
    x = net.add_input("x", TensorInfo((4,)))
    net.add_output("y", net.add_layer("Relu", inputs=[x]))
    feed = np.array([-1, 2, -3, 4], np.float32)
    async with flowrt.Runtime(registry) as rt:
        model = await rt.load(flowrt.optimize(net, backends=["Spy"], registry=registry))
        out = await model.run({"x": feed})
    assert spy.inputs_seen[0][0] is feed
    np.testing.assert_array_equal(out["y"], [0, 2, 0, 4])


async def test_concat_inputs_are_written_in_place_where_their_region_is_contiguous():
    async with flowrt.Runtime() as rt:
        model = await rt.load(flowrt.optimize(_cnn(), backends=["CpuRef"]), max_in_flight=1)
        got = (await model.run({"x": _input(5)}))["y"]
    expected = _cnn_reference(_input(5))
    tid = {node.layer: node.outputs[0] for node in model.dataflow.order}
    placements = model.layout.plans["CpuRef"].placements
    # c2 is the first input of cat: same bytes; back is a view of r1, so it is copied in.
    assert placements[tid["c2"]].offset == placements[tid["cat"]].offset
    np.testing.assert_allclose(got, expected, rtol=1e-6)
