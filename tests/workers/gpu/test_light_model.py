"""The nine light models on GpuAcc, CpuRef taking what GpuAcc declines (today: nothing)."""

import numpy as np
import pytest

import flowrt
from flowrt.models import LIGHT_MODELS, expected_outputs, expected_tolerance, light_model, pattern_input


async def test_squeezenet_fuses_every_relu_into_its_conv_on_gpuacc(gpu):
    opt = flowrt.optimize(flowrt.onnx.load(light_model("squeezenet")), backends=["GpuAcc", "CpuRef"])
    by_kind = {}
    for layer in opt.graph:
        if layer.backend:
            by_kind.setdefault(layer.kind, set()).add(layer.backend)
    assert set(by_kind) >= {"Conv", "MaxPool", "Concat", "GlobalAveragePool", "Softmax"}
    assert "Relu" not in by_kind  # every Relu follows a Conv and is fused into it
    assert {layer.activation.kind for layer in opt.graph if layer.kind == "Conv"} == {"Relu"}


# Eight run in CI, on PoCL's two CPU threads; vgg19 (the same layer kinds, 20 GFLOP, a minute
# and more there by itself) only with -m slow.
@pytest.mark.parametrize(
    "name", [pytest.param(n, marks=pytest.mark.slow) if n == "vgg19" else n for n in LIGHT_MODELS]
)
async def test_light_model_on_gpuacc_matches_expected_output(gpu, name):
    path = light_model(name)
    opt = flowrt.optimize(flowrt.onnx.load(path), backends=["GpuAcc", "CpuRef"])
    assert opt.backend_counts() == {"GpuAcc": len(opt.assignments())}
    async with flowrt.Runtime(cpu_workers=1) as rt:
        model = await rt.load(opt, max_in_flight=1)
        # One GPU segment: the feeds go up, the outputs come down, nothing else crosses.
        (segment,) = model.dataflow.segments
        assert segment.device
        assert set(segment.uploads) == set(model.dataflow.inputs.values())
        assert set(segment.downloads) == set(model.dataflow.outputs.values())
        feeds = {n: pattern_input(info) for n, info in model.inputs.items()}
        (y,) = (await model.run(feeds)).values()
    assert isinstance(y, np.ndarray)
    np.testing.assert_allclose(y, expected_outputs(path)[0], **expected_tolerance(path))
