"""The example third-party backend (examples/backends/Acme_Sample_backend.py) beside CpuRef."""

from __future__ import annotations

import numpy as np
from dynbackends import EXAMPLES

import flowrt
import flowrt.models
import flowrt.registry
from flowrt.registry.dynamic import LoadedBackend


# -- the example third-party backend -------------------------------------------------------------
def small_network() -> flowrt.Network:
    """Conv, Relu and Add (Acme_Sample's) around a grouped Conv, MaxPool and Softmax (not its)."""
    rng = np.random.default_rng(7)

    def weights(*shape: int) -> np.ndarray:
        return rng.standard_normal(shape).astype(np.float32) * 0.3

    d = flowrt.descriptors
    net = flowrt.Network()
    x = net.add_input("x", flowrt.TensorInfo((1, 3, 12, 12)))
    conv = net.add_layer("Conv", d.Conv(pads=(1, 1, 1, 1)), [x, weights(8, 3, 3, 3), weights(8)], name="conv")
    relu = net.add_layer("Relu", inputs=[conv], name="relu")
    grouped = net.add_layer("Conv", d.Conv(group=2), [relu, weights(8, 4, 1, 1)], name="grouped")
    strided = net.add_layer("Conv", d.Conv(strides=(2, 2)), [relu, weights(8, 8, 2, 2)], name="strided")
    pooled = net.add_layer("MaxPool", d.MaxPool(kernel_shape=(2, 2), strides=(2, 2)), [grouped], name="pool")
    added = net.add_layer("Add", inputs=[strided, pooled], name="add")
    net.add_output("y", net.add_layer("Softmax", d.Softmax(axis=1), [added], name="softmax"))
    return net


async def run_both(net: flowrt.Network, feeds: dict, registry) -> tuple[flowrt.OptimizedNetwork, dict, dict]:
    async with flowrt.Runtime(registry, backend_paths=[EXAMPLES]) as rt:
        assert rt.dynamic_backends.loaded == (
            LoadedBackend("Acme_Sample", (1, 0), str(EXAMPLES / "Acme_Sample_backend.py")),
        )
        opt = flowrt.optimize(net, backends=["Acme_Sample", "CpuRef"], registry=registry)
        split = await (await rt.load(opt)).run(feeds)
        ref = await (await rt.load(flowrt.optimize(net, backends=["CpuRef"], registry=registry))).run(feeds)
    return opt, split, ref


async def test_acme_sample_shares_a_network_with_cpuref(registry):
    x = np.random.default_rng(0).standard_normal((1, 3, 12, 12)).astype(np.float32)
    opt, split, ref = await run_both(small_network(), {"x": x}, registry)
    assert opt.assignments() == {
        "conv": "Acme_Sample",
        "grouped": "CpuRef",
        "strided": "Acme_Sample",
        "pool": "CpuRef",
        "add": "Acme_Sample",
        "softmax": "CpuRef",
    }
    assert opt.decisions["grouped"].declined == {
        "Acme_Sample": "Acme_Sample runs group 1 convolutions only, got group 2"
    }
    assert opt.decisions["pool"].declined["Acme_Sample"].startswith("Acme_Sample has no kernel for MaxPool")
    assert [s.describe() for s in opt.substitutions] == [
        "Acme_Sample: Conv 'conv' + Relu 'relu' -> Conv 'conv' (+Relu)"
    ]
    assert opt.graph.layers["conv"].activation.kind == "Relu"
    np.testing.assert_allclose(split["y"], ref["y"], rtol=1e-4)


async def test_acme_sample_runs_squeezenet_with_cpuref(registry):
    net = flowrt.onnx.load(flowrt.models.light_model("squeezenet"))
    feeds = {name: flowrt.models.pattern_input(info) for name, info in net_inputs(net).items()}
    opt, split, ref = await run_both(net, feeds, registry)
    kinds = {layer.name: layer.kind for layer in opt.graph}
    by_backend: dict[str, set[str]] = {}
    for layer, backend in opt.assignments().items():
        by_backend.setdefault(backend, set()).add(kinds[layer])
    assert by_backend == {
        "Acme_Sample": {"Conv"},  # every Relu follows a Conv, fused into it by optimize_subgraph
        "CpuRef": {"MaxPool", "Concat", "GlobalAveragePool", "Softmax"},
    }
    for name in ref:
        np.testing.assert_allclose(split[name], ref[name], rtol=1e-4)


def net_inputs(net: flowrt.Network) -> dict[str, flowrt.TensorInfo]:
    return {layer.descriptor.name: layer.descriptor.info for layer in net.graph.input_layers}
