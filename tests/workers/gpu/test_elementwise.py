"""GpuAcc activations and broadcasting binary ops against CpuRef."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import flowrt
from flowrt.registry import FusedActivation
from flowrt.workers.cpu.ref.kernels import load_all as ref_kernels

FLOATS = st.floats(-50, 50, width=32)


@settings(max_examples=15, deadline=None)
@given(
    kind=st.sampled_from(["Relu", "LeakyRelu", "Sigmoid", "Tanh", "HardSigmoid", "HardSwish"]),
    x=hnp.arrays(np.float32, hnp.array_shapes(min_dims=1, max_dims=4, max_side=20), elements=FLOATS),
)
def test_activations_match_cpuref(run_both, kind, x):
    desc = getattr(flowrt.descriptors, kind)()
    (got,), (expected,) = run_both(kind, desc, [x])
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)


@settings(max_examples=15, deadline=None)
@given(
    kind=st.sampled_from(["Add", "Sub", "Mul", "Div"]),
    shapes=hnp.mutually_broadcastable_shapes(num_shapes=2, max_dims=5, max_side=8),
    data=st.data(),
)
def test_binary_ops_broadcast_like_cpuref(run_both, kind, shapes, data):
    a, b = (
        data.draw(hnp.arrays(np.float32, shape, elements=st.floats(0.5, 50, width=32)))
        for shape in shapes.input_shapes
    )
    if a.size == 0 or b.size == 0:
        return
    (got,), (expected,) = run_both(kind, getattr(flowrt.descriptors, kind)(), [a, b])
    np.testing.assert_allclose(got, expected, rtol=1e-6)


def test_sum_folds_three_broadcasting_inputs(run_both):
    rng = np.random.default_rng(1)
    inputs = [rng.standard_normal(s).astype(np.float32) for s in [(2, 3, 4), (3, 1), (4,)]]
    (got,), (expected,) = run_both("Sum", flowrt.descriptors.Sum(), inputs)
    np.testing.assert_allclose(got, expected, rtol=1e-6)


@pytest.mark.parametrize(
    "activation",
    [
        FusedActivation("Relu"),
        FusedActivation("LeakyRelu", alpha=0.1),
        FusedActivation("Clip", alpha=-0.5, beta=0.25),
        FusedActivation("Sigmoid"),
        FusedActivation("Tanh"),
        FusedActivation("HardSigmoid", alpha=0.3, beta=0.4),
        FusedActivation("HardSwish"),
        FusedActivation("Swish", alpha=1.5),
    ],
)
def test_fused_activation_applies_to_the_output(run_both, activation):
    rng = np.random.default_rng(2)
    a, b = rng.standard_normal((3, 5)).astype(np.float32), rng.standard_normal(5).astype(np.float32)
    (got,), (added,) = run_both("Add", flowrt.descriptors.Add(), [a, b], activation=activation)
    kind = activation.kind
    if kind == "Clip":
        expected = np.clip(added, activation.alpha, activation.beta)
    else:
        params = {"LeakyRelu": {"alpha": activation.alpha}}
        params["HardSigmoid"] = {"alpha": activation.alpha, "beta": activation.beta}
        params["Swish"] = {"alpha": activation.alpha}
        desc = getattr(flowrt.descriptors, kind)(**params.get(kind, {}))
        expected = ref_kernels()[kind](desc, added)
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-7)


def test_sigmoid_saturates_without_overflow(run_both):
    x = np.array([-1e4, -100, 0, 100, 1e4], np.float32)
    (got,), _ = run_both("Sigmoid", flowrt.descriptors.Sigmoid(), [x])
    np.testing.assert_allclose(got, [0, 0, 0.5, 1, 1], atol=1e-30)


@pytest.mark.parametrize("alpha", [1.0, 1.702])
def test_swish_matches_cpuref_and_saturates_without_overflow(run_both, alpha):
    x = np.concatenate([np.linspace(-20, 20, 81), [-1e4, -100, 100, 1e4]]).astype(np.float32)
    (got,), (expected,) = run_both("Swish", flowrt.descriptors.Swish(alpha=alpha), [x])
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(got[-4:], [0, 0, 100, 1e4], atol=1e-30)


async def test_llamas_gate_matmul_then_silu_is_one_gpuacc_layer(gpu):
    """Sigmoid(x) * x after a MatMul (a feed-forward gate, as exported) is fused into Swish and
    applied in the MatMul's epilogue: one launch."""
    rng = np.random.default_rng(4)
    net = flowrt.Network()
    x = net.add_input("x", flowrt.types.TensorInfo((1, 16, 32)))
    w = rng.standard_normal((32, 48)).astype(np.float32) * 0.3
    gate = net.add_layer("MatMul", inputs=[x, w], name="gate")
    sigmoid = net.add_layer("Sigmoid", inputs=[gate], name="sigmoid")
    net.add_output("y", net.add_layer("Mul", inputs=[gate, sigmoid], name="silu"))
    opt = flowrt.optimize(net, backends=["GpuAcc", "CpuRef"])
    layers = [layer for layer in opt.graph if layer.kind not in ("Input", "Output", "Constant")]
    assert [(layer.kind, layer.backend) for layer in layers] == [("MatMul", "GpuAcc")]
    assert layers[0].activation.kind == "Swish"
    feeds = {"x": rng.standard_normal((1, 16, 32)).astype(np.float32)}
    async with flowrt.Runtime(cpu_workers=1) as rt:
        got = await (await rt.load(opt)).run(feeds)
        want = await (await rt.load(flowrt.optimize(net, backends=["CpuRef"]))).run(feeds)
    np.testing.assert_allclose(got["y"], want["y"], rtol=1e-5, atol=1e-5)


def test_hard_sigmoid_takes_its_slope_and_offset_from_the_layer(run_both):
    x = np.linspace(-6, 6, 49, dtype=np.float32)
    (got,), (expected,) = run_both("HardSigmoid", flowrt.descriptors.HardSigmoid(alpha=0.25, beta=0.6), [x])
    np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-7)
    assert got[0] == 0 and got[-1] == 1 and 0 < got[24] < 1  # both bounds, and the slope between


async def test_conv_then_hard_swish_is_one_gpuacc_layer(gpu):
    rng = np.random.default_rng(3)
    net = flowrt.Network()
    x = net.add_input("x", flowrt.types.TensorInfo((1, 3, 8, 8)))
    w = rng.standard_normal((4, 3, 3, 3)).astype(np.float32)
    conv = net.add_layer("Conv", flowrt.descriptors.Conv(pads=(1, 1, 1, 1)), [x, w], name="conv")
    net.add_output("y", net.add_layer("HardSwish", inputs=[conv], name="hswish"))
    opt = flowrt.optimize(net, backends=["GpuAcc", "CpuRef"])
    layers = [layer for layer in opt.graph if layer.kind not in ("Input", "Output", "Constant")]
    assert [(layer.kind, layer.backend) for layer in layers] == [("Conv", "GpuAcc")]
    feeds = {"x": rng.standard_normal((1, 3, 8, 8)).astype(np.float32)}
    async with flowrt.Runtime(cpu_workers=1) as rt:
        got = await (await rt.load(opt)).run(feeds)
        want = await (await rt.load(flowrt.optimize(net, backends=["CpuRef"]))).run(feeds)
    np.testing.assert_allclose(got["y"], want["y"], rtol=1e-5, atol=1e-5)
