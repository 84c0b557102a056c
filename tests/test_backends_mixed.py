"""Mixed execution: layers forced onto backends by layer_backend_hints, the copies and
imports the optimizer records, and what the dataflow then moves."""

import numpy as np
import pytest

import flowrt
from flowrt.defaults import gpu_device_present
from flowrt.errors import BackendError, GraphError, UnsupportedLayerError
from flowrt.models import light_model, pattern_input
from flowrt.types import TensorInfo
from flowrt.workers.gpu.device import describe_devices, unavailable_reason


def squeezenet_logits() -> flowrt.Network:
    """squeezenet without its final softmax, whose expected output is degenerate (see
    tests/integration/test_light_models.py)."""
    net = flowrt.onnx.load(light_model("squeezenet"))
    (softmax,) = net.graph.of_kind("Softmax")
    net.graph.reroute(softmax.outputs[0], softmax.inputs[0].source)
    net.graph.remove_layer(softmax)
    return net


def crossing_tensors(opt: flowrt.OptimizedNetwork, model: flowrt.LoadedNetwork) -> tuple[set, set]:
    """(tensors the dataflow uploads, tensors it downloads) as "layer:index" names."""
    names = {tid: f"{name}:0" for name, tid in model.dataflow.inputs.items()}
    for node in model.dataflow.order:
        names.update({tid: f"{node.layer}:{i}" for i, tid in enumerate(node.outputs) if tid is not None})
    uploads = {names[t] for s in model.dataflow.segments for t in s.uploads}
    downloads = {names[t] for s in model.dataflow.segments for t in s.downloads}
    return uploads, downloads


def opencl_device() -> str | None:
    """The device GpuAcc tests name: None (the GPU) where OpenCL shows one, else the first
    device (PoCL's CPU device on CI), which GpuAcc takes only when named."""
    return None if gpu_device_present() else describe_devices()[0].index


@pytest.mark.skipif(bool(unavailable_reason()), reason="needs an OpenCL device")
async def test_squeezenet_split_across_gpuacc_and_cpuacc_by_hints_matches_cpuref():
    net = squeezenet_logits()
    hints = {"n2": "CpuAcc", "n3": "CpuAcc", "n4": "CpuAcc", "n24": "CpuAcc"}
    options = flowrt.OptimizerOptions(layer_backend_hints=hints)
    opt = flowrt.optimize(net, backends=["GpuAcc", "CpuAcc"], options=options)
    assert {name: opt.assignments()[name] for name in ("n0", "n2", "n3", "n5", "n24")} == {
        "n0": "GpuAcc",
        "n2": "CpuAcc",
        "n3": "CpuAcc",
        "n5": "GpuAcc",
        "n24": "CpuAcc",
    }
    copies = {(c.tensor, c.target) for c in opt.copies()}
    assert {("n0:0", "host"), ("n3:0", "GpuAcc"), ("n24:0", "GpuAcc")} <= copies
    feeds = {"data_0": pattern_input(TensorInfo((1, 3, 224, 224)))}
    async with flowrt.Runtime(cpu_workers=2, opencl_device=opencl_device()) as rt:
        model = await rt.load(opt, max_in_flight=1)
        got = await model.run(feeds)
        ref = await (await rt.load(flowrt.optimize(net, backends=["CpuRef"]), max_in_flight=1)).run(feeds)
    uploads, downloads = crossing_tensors(opt, model)
    assert uploads == {c.tensor for c in opt.copies() if c.target == "GpuAcc"}
    assert downloads == {c.tensor for c in opt.copies() if c.target == "host"}
    for name in ref:
        np.testing.assert_allclose(got[name], ref[name], rtol=1e-3)


def small_network() -> flowrt.Network:
    net = flowrt.Network()
    x = net.add_input("x", TensorInfo((2, 3)))
    add = net.add_layer("Add", inputs=[x, np.ones((2, 3), np.float32)], name="add")
    relu = net.add_layer("Relu", inputs=[add], name="relu")
    net.add_output("y", net.add_layer("Softmax", flowrt.descriptors.Softmax(axis=1), [relu], name="softmax"))
    return net


async def test_host_backends_share_tensors_through_zero_copy_imports():
    options = flowrt.OptimizerOptions(fuse_activations=False, layer_backend_hints={"relu": "CpuRef"})
    opt = flowrt.optimize(small_network(), backends=["CpuAcc", "CpuRef"], options=options)
    assert opt.assignments() == {"add": "CpuAcc", "relu": "CpuRef", "softmax": "CpuAcc"}
    assert not opt.copies()
    assert [c.describe() for c in opt.imports()] == [
        "add:0: CpuAcc -> CpuRef (zero-copy import) for 'relu'",
        "relu:0: CpuRef -> CpuAcc (zero-copy import) for 'softmax'",
    ]
    assert "imports (2):" in opt.report() and "copies: none" in opt.report()
    x = np.arange(6, dtype=np.float32).reshape(2, 3) - 3
    async with flowrt.Runtime(cpu_workers=1) as rt:
        got = await (await rt.load(opt, max_in_flight=1)).run({"x": x})
    e = np.exp(np.maximum(x + 1, 0))
    np.testing.assert_allclose(got["y"], e / e.sum(axis=1, keepdims=True), rtol=1e-6)


@pytest.mark.parametrize(
    "hints, error, message",
    [
        (
            {"relu": "GpuAcc"},
            BackendError,
            r"expected a backend of the preference list \['CpuAcc', 'CpuRef'\]",
        ),
        ({"nope": "CpuRef"}, GraphError, "names layer 'nope', which the network does not have"),
    ],
)
def test_a_bad_hint_is_a_clear_error(hints, error, message):
    options = flowrt.OptimizerOptions(layer_backend_hints=hints)
    with pytest.raises(error, match=message):
        flowrt.optimize(small_network(), backends=["CpuAcc", "CpuRef"], options=options)


def test_a_hint_to_a_backend_that_declines_the_layer_names_its_reason():
    net = flowrt.Network()
    x = net.add_input("x", TensorInfo((4,), flowrt.DataType.STRING))
    net.add_output("y", net.add_layer("Identity", inputs=[x], name="same"))
    net.add_output("z", net.add_layer("Shape", inputs=[x], name="shape"))
    options = flowrt.OptimizerOptions(layer_backend_hints={"shape": "CpuAcc"}, fold_constants=False)
    with pytest.raises(
        UnsupportedLayerError, match="puts layer 'shape' \\(Shape\\) on CpuAcc, which does not"
    ):
        flowrt.optimize(net, backends=["CpuRef", "CpuAcc"], options=options)
