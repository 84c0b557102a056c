"""A .flowrt file whose layers were moved or edited (checksum recomputed) is checked again
against each layer's backend at load (issue 32, item 9): what the backend does not take as it
stands, fused activation included, is a ModelLoadError naming the layer and backend, never a
network that runs without its activations."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from fakes import PartialBackend
from fuzzflowrt import join_flowrt, split_flowrt
from netbuild import branchy_network, serializable_network

import flowrt
from flowrt import serialize
from flowrt.defaults import gpu_device_present
from flowrt.errors import BackendError, ModelLoadError
from flowrt.registry import BackendRegistry, FusedActivation
from flowrt.workers.cpu.ref import RefBackend
from flowrt.workers.gpu.device import describe_devices, unavailable_reason


def _saved(tmp_path: Path, optimized: flowrt.OptimizedNetwork) -> Path:
    path = tmp_path / "m.flowrt"
    serialize.save(optimized, path)
    return path


def _edit(path: Path, edit) -> None:
    """Change the metadata of the file at ``path``; lengths and checksum made right again."""
    data = path.read_bytes()
    metadata, section = split_flowrt(data)
    for layer in metadata["layers"]:
        edit(layer)
    path.write_bytes(join_flowrt(data, metadata, section))


def _move(names: set[str], backend: str):
    def edit(layer: dict) -> None:
        if layer["name"] in names:
            layer["backend"] = backend

    return edit


def test_conv_with_a_fused_relu_moved_from_cpuacc_to_cpuref_is_refused(tmp_path):
    optimized = flowrt.optimize(serializable_network(), ["CpuAcc", "CpuRef"])
    assert optimized.graph.layers["conv"].activation == FusedActivation("Relu")
    path = _saved(tmp_path, optimized)
    assert serialize.load(path).graph.layers["conv"].activation == FusedActivation("Relu")
    _edit(path, _move({"conv"}, "CpuRef"))
    with pytest.raises(
        ModelLoadError,
        match=r"m\.flowrt: layer 'conv' \(Conv\) is on backend CpuRef, which does not take it: it carries a "
        r"fused Relu: CpuRef applies fused activations to no layer kind \(capability fused_activation\)",
    ):
        serialize.load(path)


def test_a_fused_activation_on_a_kind_its_backend_does_not_fuse_into_is_refused(tmp_path):
    path = _saved(tmp_path, flowrt.optimize(serializable_network(), ["CpuAcc", "CpuRef"]))

    def relu_on_pool(layer: dict) -> None:
        if layer["kind"] == "MaxPool":
            layer["activation"] = ["FusedActivation", {"kind": "Relu"}]

    _edit(path, relu_on_pool)
    with pytest.raises(
        ModelLoadError,
        match=r"\(MaxPool\) is on backend CpuAcc.*fused Relu: CpuAcc applies fused activations to Add, .* only",
    ):
        serialize.load(path)


def _partial_registry() -> BackendRegistry:
    registry = BackendRegistry()
    registry.register("CpuRef", RefBackend)
    registry.register("Partial", lambda: PartialBackend("Partial", {"Relu"}))
    return registry


def test_a_layer_moved_to_a_backend_that_declines_it_is_refused_with_its_reason(tmp_path):
    registry = _partial_registry()
    path = _saved(tmp_path, flowrt.optimize(branchy_network(), ["Partial", "CpuRef"], registry=registry))
    _edit(path, _move({"left"}, "Partial"))
    with pytest.raises(
        ModelLoadError,
        match=r"layer 'left' \(Sigmoid\) is on backend Partial, which does not take it: Partial only runs Relu",
    ):
        serialize.load(path, registry=registry)


def test_a_backend_the_registry_lacks_is_refused_naming_it(tmp_path):
    path = _saved(
        tmp_path, flowrt.optimize(branchy_network(), ["Partial", "CpuRef"], registry=_partial_registry())
    )
    registry = BackendRegistry()
    registry.register("CpuRef", RefBackend)
    with pytest.raises(
        ModelLoadError, match=r"layer 'relu' \(Relu\) is on backend Partial, which is not registered"
    ):
        serialize.load(path, registry=registry)


def test_two_outputs_of_one_name_are_refused(tmp_path):
    path = _saved(tmp_path, flowrt.optimize(serializable_network(), backends=["CpuRef"]))

    def rename(layer: dict) -> None:
        if layer["kind"] == "Output":
            layer["descriptor"]["name"] = "probs"

    _edit(path, rename)
    with pytest.raises(
        ModelLoadError,
        match=r"\(Output\): expected a distinct str output name, found a second output called 'probs'",
    ):
        serialize.load(path)


async def test_cpuref_refuses_to_build_a_layer_that_carries_a_fused_activation():
    optimized = flowrt.optimize(serializable_network(), ["CpuRef"])
    optimized.graph.layers["gemm"].activation = FusedActivation("Relu")  # as a hand edit would
    async with flowrt.Runtime(cpu_workers=1) as rt:
        with pytest.raises(
            BackendError,
            match=r"CpuRef applies no fused activation; layer 'gemm' \(Gemm\) carries a fused Relu",
        ):
            await rt.load(optimized)


async def test_cpuacc_refuses_to_build_a_fused_activation_on_a_kind_it_does_not_fuse_into():
    net = flowrt.Network()
    x = net.add_input("x", flowrt.TensorInfo((1, 2, 4, 4)))
    pool = net.add_layer("MaxPool", flowrt.descriptors.MaxPool(kernel_shape=(2, 2)), inputs=[x], name="pool")
    net.add_output("y", pool)
    optimized = flowrt.optimize(net, ["CpuAcc"])
    optimized.graph.layers["pool"].activation = FusedActivation("Relu")  # as a hand edit would
    async with flowrt.Runtime(cpu_workers=1) as rt:
        with pytest.raises(
            BackendError,
            match=r"CpuAcc applies fused activations to Add, .* only; layer 'pool' \(MaxPool\) carries a fused Relu",
        ):
            await rt.load(optimized)


@pytest.mark.skipif(bool(unavailable_reason()), reason="needs an OpenCL device")
async def test_conv_with_a_fused_relu_moved_to_gpuacc_runs_with_its_relu(tmp_path):
    net = flowrt.Network()
    x = net.add_input("x", flowrt.TensorInfo((1, 2, 6, 6)))
    weights = np.random.default_rng(0).standard_normal((3, 2, 3, 3)).astype(np.float32)
    conv = net.add_layer("Conv", flowrt.descriptors.Conv(pads=(1, 1, 1, 1)), inputs=[x, weights], name="conv")
    net.add_output("y", net.add_layer("Relu", inputs=[conv], name="relu"))
    path = _saved(tmp_path, flowrt.optimize(net, ["CpuAcc", "GpuAcc", "CpuRef"]))
    _edit(path, _move({"conv"}, "GpuAcc"))
    moved = serialize.load(path)
    assert (moved.graph.layers["conv"].backend, moved.graph.layers["conv"].activation) == (
        "GpuAcc",
        FusedActivation("Relu"),
    )
    feed = np.random.default_rng(1).standard_normal((1, 2, 6, 6)).astype(np.float32)
    # A CPU OpenCL device (PoCL, on CI) runs GpuAcc only when named.
    named = None if gpu_device_present() else describe_devices()[0].index
    async with flowrt.Runtime(cpu_workers=1, opencl_device=named) as rt:
        got = (await (await rt.load(moved)).run({"x": feed}))["y"]
        expected = (await (await rt.load(flowrt.optimize(net, backends=["CpuRef"]))).run({"x": feed}))["y"]
    assert got.min() == 0 and np.allclose(got, expected, atol=1e-5)
    _edit(path, _move({"conv"}, "CpuRef"))
    with pytest.raises(
        ModelLoadError, match=r"layer 'conv' \(Conv\) is on backend CpuRef, which does not take it"
    ):
        serialize.load(path)
