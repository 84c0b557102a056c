"""A small network of recorded CpuAcc layers and the helpers that run it and find what its
memory pools recorded, shared by the tests of recording (``test_launches.py``) and of the
chains that replay them (``test_launch_chains.py``)."""

import numpy as np
import trio

import flowrt
from flowrt.engine.scheduler.binding import BoundStep
from flowrt.types import TensorInfo
from flowrt.workers.cpu.acc.launches import LaunchCall


def network() -> flowrt.Network:
    """Convs of several algorithms (1x1, 3x3, grouped, strided) and a broadcast Add."""
    rng = np.random.default_rng(0)

    def w(*shape):
        return (rng.standard_normal(shape) / np.sqrt(np.prod(shape[1:]))).astype(np.float32)

    net = flowrt.Network()
    x = net.add_input("x", TensorInfo((1, 8, 20, 20)))
    pad = flowrt.descriptors.Conv(pads=(1, 1, 1, 1))
    a = net.add_layer("Conv", None, [x, w(16, 8, 1, 1), w(16)], name="pointwise")
    b = net.add_layer("Conv", pad, [a, w(16, 16, 3, 3)], name="three")
    c = net.add_layer(
        "Conv",
        flowrt.descriptors.Conv(pads=(1, 1, 1, 1), strides=(2, 2)),
        [b, w(24, 16, 3, 3)],
        name="strided",
    )
    d = net.add_layer("Conv", flowrt.descriptors.Conv(group=2), [c, w(24, 12, 1, 1)], name="grouped")
    e = net.add_layer("Add", inputs=[d, w(24, 1, 1)], name="add")
    net.add_output("y", net.add_layer("Conv", None, [e, w(4, 24, 1, 1)], name="last"))
    return net


def random_input(seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((1, 8, 20, 20)).astype(np.float32)


def recorded_layers(model) -> list[str]:
    return recorded_layers_of(model.pools.pools[0])


def recorded_steps(pool) -> list[BoundStep]:
    return [
        step
        for steps in pool.programs.values()
        for step in steps
        if type(step) is BoundStep
        and isinstance(getattr(step.call, "keep", None), tuple)  # Launches.compile's
    ]


def recorded_calls(pool) -> list[LaunchCall]:
    return [
        call for step in recorded_steps(pool) for call in step.call.keep[0] if isinstance(call, LaunchCall)
    ]


def recorded_layers_of(pool) -> list[str]:
    return [
        node.layer
        for step in recorded_steps(pool)
        for node, call in zip(step.nodes, step.call.keep[0])
        if isinstance(call, LaunchCall)
    ]


async def checked_runs(rt, net: flowrt.Network, max_in_flight: int, rounds: int, at_once: int = 1):
    """``net`` loaded on CpuAcc in ``rt``, run ``rounds`` times ``at_once`` runs in flight, each
    result checked against CpuRef's; the loaded model."""
    reference = await rt.load(flowrt.optimize(net, backends=["CpuRef"]))
    model = await rt.load(flowrt.optimize(net, backends=["CpuAcc", "CpuRef"]), max_in_flight=max_in_flight)
    results: dict[int, np.ndarray] = {}

    async def run(seed: int) -> None:
        results[seed] = (await model.run({"x": random_input(seed)}))["y"]

    for round_ in range(rounds):
        async with trio.open_nursery() as nursery:
            for seed in range(round_ * at_once, (round_ + 1) * at_once):
                nursery.start_soon(run, seed)
    for seed, got in results.items():
        want = (await reference.run({"x": random_input(seed)}))["y"]
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    return model


def fork_network(seed: int, join) -> flowrt.Network:
    """x -> a (1x1 conv) -> b (3x3 conv), then ``join(net, a, b, w)``'s layers (``w(*shape)``:
    random weights), whose last is the output y."""
    rng = np.random.default_rng(seed)

    def w(*shape):
        return (rng.standard_normal(shape) / np.sqrt(np.prod(shape[1:]))).astype(np.float32)

    net = flowrt.Network()
    x = net.add_input("x", TensorInfo((1, 8, 20, 20)))
    a = net.add_layer("Conv", None, [x, w(8, 8, 1, 1)], name="a")
    b = net.add_layer("Conv", flowrt.descriptors.Conv(pads=(1, 1, 1, 1)), [a, w(8, 8, 3, 3)], name="b")
    net.add_output("y", join(net, a, b, w))
    return net
