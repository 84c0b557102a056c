"""CpuAcc fuses the curves of mobile and transformer models into the layer before them:
HardSwish, HardSigmoid, SiLU (x * Sigmoid(x), first written as one Swish), Elu, exact Gelu and
Softsign, after a Conv, a Gemm or an elementwise layer; the result is ONNX Runtime's."""

import numpy as np
import onnxruntime as ort
import pytest
import trio
from onnx import TensorProto, helper, numpy_helper

import flowrt
from flowrt.registry import FusedActivation

RNG = np.random.default_rng(11)
W = (RNG.standard_normal((8, 4, 3, 3)) * 0.5).astype(np.float32)
B = RNG.standard_normal(8).astype(np.float32)


def _conv_then(curve: str, **attributes) -> tuple[bytes, str]:
    """A Conv followed by ``curve`` (``"SiLU"``: Sigmoid and Mul), as a serialized model."""
    nodes = [helper.make_node("Conv", ["x", "W", "B"], ["y"], pads=[1, 1, 1, 1])]
    if curve == "SiLU":
        nodes += [helper.make_node("Sigmoid", ["y"], ["s"]), helper.make_node("Mul", ["y", "s"], ["z"])]
    else:
        nodes.append(helper.make_node(curve, ["y"], ["z"], **attributes))
    graph = helper.make_graph(
        nodes,
        "conv_curve",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 9, 9])],
        [helper.make_tensor_value_info("z", TensorProto.FLOAT, [1, 8, 9, 9])],
        [numpy_helper.from_array(W, "W"), numpy_helper.from_array(B, "B")],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)]).SerializeToString()


def _run(opt: flowrt.OptimizedNetwork, x: np.ndarray) -> np.ndarray:
    async def main():
        async with flowrt.Runtime(cpu_workers=1) as rt:
            return (await (await rt.load(opt)).run({"x": x}))["z"]

    return trio.run(main)


@pytest.mark.parametrize(
    "curve, attributes, fused",
    [
        ("HardSwish", {}, "HardSwish"),
        ("HardSigmoid", {"alpha": 0.25, "beta": 0.4}, "HardSigmoid"),
        ("SiLU", {}, "Swish"),
        ("Elu", {"alpha": 0.7}, "Elu"),
        ("Gelu", {}, "Gelu"),
        ("Softsign", {}, "Softsign"),
    ],
)
def test_a_curve_after_a_conv_is_applied_by_the_conv_as_onnxruntime_computes_it(curve, attributes, fused):
    model = _conv_then(curve, **attributes)
    opt = flowrt.optimize(flowrt.onnx.load(model), backends=["CpuAcc", "CpuRef"])
    (conv,) = [layer for layer in opt.graph if layer.kind == "Conv"]
    assert conv.activation is not None and conv.activation.kind == fused
    assert [layer.kind for layer in opt.graph if layer.kind not in ("Input", "Output", "Constant")] == [
        "Conv"
    ]
    assert f"-> Conv {conv.name!r} (+{fused})" in opt.report()  # what flowrt inspect shows
    x = (RNG.standard_normal((1, 4, 9, 9)) * 2).astype(np.float32)
    expected = ort.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_allclose(_run(opt, x), expected, rtol=1e-4, atol=1e-5)


def test_a_gelu_in_its_tanh_form_is_applied_by_the_conv_in_that_form():
    model = _conv_then("Gelu", approximate="tanh")
    opt = flowrt.optimize(flowrt.onnx.load(model), backends=["CpuAcc", "CpuRef"])
    (conv,) = [layer for layer in opt.graph if layer.kind == "Conv"]
    assert [layer.kind for layer in opt.graph if layer.kind not in ("Input", "Output", "Constant")] == [
        "Conv"
    ]
    assert conv.activation == FusedActivation("Gelu", form="tanh")
    assert f"-> Conv {conv.name!r} (+Gelu tanh)" in opt.report()
    x = (RNG.standard_normal((1, 4, 9, 9)) * 2).astype(np.float32)
    expected = ort.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_allclose(_run(opt, x), expected, rtol=1e-4, atol=1e-5)


def test_the_engine_fuses_only_the_common_activations_for_other_backends():
    """GpuAcc and third-party backends are offered Relu, LeakyRelu, Clip, Sigmoid and Tanh,
    which every backend that declares fused activations applies."""
    model = _conv_then("HardSwish")
    opt = flowrt.optimize(flowrt.onnx.load(model), backends=["CpuRef"])
    assert [layer.kind for layer in opt.graph if layer.kind in ("Conv", "HardSwish")] == ["Conv", "HardSwish"]
