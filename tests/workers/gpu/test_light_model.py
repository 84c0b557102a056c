"""A whole light model on GpuAcc, CpuRef taking what GpuAcc declines."""

import numpy as np

import flowrt
from flowrt.models import expected_outputs, expected_tolerance, light_model, pattern_input
from flowrt.workers.gpu import GpuAccBackend


async def test_squeezenet_on_gpuacc_matches_expected_output(gpu):
    registry = flowrt.backend_registry().copy()
    if not registry.is_registered("GpuAcc"):
        registry.register("GpuAcc", GpuAccBackend)
    path = light_model("squeezenet")
    opt = flowrt.optimize(flowrt.onnx.load(path), backends=["GpuAcc", "CpuRef"], registry=registry)
    by_kind = {}
    for layer in opt.graph:
        if layer.backend:
            by_kind.setdefault(layer.kind, set()).add(layer.backend)
    assert set(by_kind) >= {"Conv", "MaxPool", "Concat", "GlobalAveragePool", "Softmax"}
    # every Relu follows a Conv and is fused into it
    assert "Relu" not in by_kind
    assert {layer.activation.kind for layer in opt.graph if layer.kind == "Conv"} == {"Relu"}
    assert set().union(*by_kind.values()) == {"GpuAcc"}
    async with flowrt.Runtime(registry) as rt:
        model = await rt.load(opt)
        feeds = {name: pattern_input(info) for name, info in model.inputs.items()}
        (y,) = (await model.run(feeds)).values()
    assert isinstance(y, np.ndarray)
    np.testing.assert_allclose(y, expected_outputs(path)[0], **expected_tolerance(path))
