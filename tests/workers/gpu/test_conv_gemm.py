"""GpuAcc Conv (im2col + tiled GEMM), Gemm and MatMul against CpuRef."""

import attrs
import numpy as np
import pytest
import trio
from hypothesis import given, settings
from hypothesis import strategies as st

import flowrt
from flowrt.registry import FusedActivation
from flowrt.types import TensorInfo
from flowrt.workers.gpu.kernels import gemm as gemm_module
from flowrt.workers.gpu.kernels.gemm import TILINGS, TK, plan_gemm
from flowrt.workers.gpu.program import EXTRA_OPTIONS_ENV


def _normal(rng, *shape):
    return rng.standard_normal(shape).astype(np.float32)


@st.composite
def convolutions(draw):
    groups = draw(st.sampled_from([1, 1, 2, 3]))
    depthwise = draw(st.booleans()) and groups > 1
    c = groups if depthwise else groups * draw(st.integers(1, 4))
    m = groups * draw(st.integers(1, 5))
    kh, kw = draw(st.integers(1, 4)), draw(st.integers(1, 4))
    sh, sw = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    dh, dw = draw(st.integers(1, 2)), draw(st.integers(1, 2))
    pads = tuple(draw(st.integers(0, 2)) for _ in range(4))
    h = draw(st.integers((kh - 1) * dh + 1, 14))
    w = draw(st.integers((kw - 1) * dw + 1, 14))
    n = draw(st.integers(1, 2))
    auto_pad = draw(st.sampled_from(["NOTSET", "NOTSET", "SAME_UPPER", "VALID"]))
    desc = flowrt.descriptors.Conv(
        group=groups, strides=(sh, sw), dilations=(dh, dw), auto_pad=auto_pad,
        pads=pads if auto_pad == "NOTSET" else None,
    )  # fmt: skip
    return desc, (n, c, h, w), (m, c // groups, kh, kw), draw(st.booleans()), draw(st.integers(0, 2**31))


@settings(max_examples=15, deadline=None)
@given(case=convolutions())
def test_conv_matches_cpuref(run_both, case):
    desc, x_shape, w_shape, with_bias, seed = case
    rng = np.random.default_rng(seed)
    inputs = [_normal(rng, *x_shape), _normal(rng, *w_shape)]
    if with_bias:
        inputs.append(_normal(rng, w_shape[0]))
    (got,), (expected,) = run_both("Conv", desc, inputs, constant=(1, 2))
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4)


def test_pointwise_conv_with_fused_relu_reads_the_input_directly(run_both):
    rng = np.random.default_rng(3)
    x, w, b = _normal(rng, 2, 70, 9, 11), _normal(rng, 65, 70, 1, 1), _normal(rng, 65)
    (got,), (expected,) = run_both(
        "Conv", flowrt.descriptors.Conv(), [x, w, b], constant=(1, 2), activation=FusedActivation("Relu")
    )
    np.testing.assert_allclose(got, np.maximum(expected, 0), rtol=1e-4, atol=1e-4)


def test_conv_weights_may_come_from_another_layer(run_both):
    rng = np.random.default_rng(4)
    x, w = _normal(rng, 1, 3, 8, 8), _normal(rng, 4, 3, 3, 3)
    (got,), (expected,) = run_both("Conv", flowrt.descriptors.Conv(), [x, w])
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4)


@settings(max_examples=15, deadline=None)
@given(
    m=st.integers(1, 70),
    n=st.integers(1, 70),
    k=st.integers(1, 90),
    trans_a=st.integers(0, 1),
    trans_b=st.integers(0, 1),
    c_shape=st.sampled_from(["none", "scalar", "row", "column", "full"]),
    alpha=st.sampled_from([1.0, 0.5]),
    beta=st.sampled_from([1.0, 2.0, 0.0]),
    seed=st.integers(0, 2**31),
)
def test_gemm_matches_cpuref(run_both, m, n, k, trans_a, trans_b, c_shape, alpha, beta, seed):
    rng = np.random.default_rng(seed)
    a = _normal(rng, *((k, m) if trans_a else (m, k)))
    b = _normal(rng, *((n, k) if trans_b else (k, n)))
    inputs = [a, b]
    shapes = {"scalar": (), "row": (n,), "column": (m, 1), "full": (m, n)}
    if c_shape != "none":
        inputs.append(_normal(rng, *shapes[c_shape]))
    desc = flowrt.descriptors.Gemm(transA=trans_a, transB=trans_b, alpha=alpha, beta=beta)
    (got,), (expected,) = run_both("Gemm", desc, inputs, constant=(1, 2))
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4)


def test_matmul_matches_cpuref(run_both):
    rng = np.random.default_rng(5)
    a, b = _normal(rng, 33, 100), _normal(rng, 100, 129)
    (got,), (expected,) = run_both("MatMul", flowrt.descriptors.MatMul(), [a, b])
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("splits", [1, 3])
@pytest.mark.parametrize("tiling", sorted(TILINGS))
def test_every_tiling_and_k_split_matches_cpuref(run_both, monkeypatch, force_gemm_plan, tiling, splits):
    """Each build of gemm.cl, whole or with K split and reduced, on shapes no tile divides:
    a grouped convolution with bias and a fused ReLU, and a Gemm of transposed operands."""
    force_gemm_plan(tiling, splits)
    # Unoptimized builds of their own: PoCL spends seconds optimizing each tiling it would not run.
    monkeypatch.setenv(EXTRA_OPTIONS_ENV, "-cl-opt-disable")
    rng = np.random.default_rng(11)
    x, w, b = _normal(rng, 2, 40, 9, 11), _normal(rng, 70, 20, 3, 3), _normal(rng, 70)
    (got,), (expected,) = run_both(
        "Conv", flowrt.descriptors.Conv(group=2, pads=(1, 1, 1, 1)), [x, w, b], constant=(1, 2),
        activation=FusedActivation("Relu"),
    )  # fmt: skip
    np.testing.assert_allclose(got, np.maximum(expected, 0), rtol=1e-4, atol=1e-4)
    a, bt, c = _normal(rng, 100, 37), _normal(rng, 75, 100), _normal(rng, 37, 75)
    desc = flowrt.descriptors.Gemm(transA=1, transB=1, alpha=0.5, beta=2.0)
    (got,), (expected,) = run_both("Gemm", desc, [a, bt, c], constant=(1, 2))
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4)


def test_gemm_plan_splits_deep_narrow_products_and_tiles_wide_ones_whole():
    deep = plan_gemm((512, 49, 4608), 1, units=132)  # resnet50's last 3x3 conv at batch 1
    assert deep.splits > 1
    assert deep.k_split % TK == 0 and deep.splits * deep.k_split >= 4608 > (deep.splits - 1) * deep.k_split
    wide = plan_gemm((256, 3136, 64), 8, units=132)
    assert wide.splits == 1 and wide.tiling.rows * wide.tiling.cols >= 64 * 64  # large tiles, K whole
    # a device of two compute units is filled by a few tiles: nothing to gain from splitting
    assert plan_gemm((512, 784, 128), 1, units=2).splits == 1
    # a CPU device runs one tiling, whole
    cpu = plan_gemm((512, 49, 4608), 1, units=132, cpu=True)
    assert (cpu.tiling, cpu.splits) == (TILINGS[gemm_module.CPU_TILING], 1) and cpu.k_split >= 4608


@pytest.mark.parametrize("splits", [1, 3])
def test_fused_conv_adds_its_residual_before_the_activation(run_both, monkeypatch, splits):
    planned = gemm_module.plan_gemm
    monkeypatch.setattr(
        gemm_module, "plan_gemm",
        lambda shape, batches, units, cpu=False, tilings=TILINGS, whole_k=False: attrs.evolve(
            planned(shape, batches, units), splits=splits, k_split=-(-shape[2] // splits // TK) * TK
        ),
    )  # fmt: skip
    rng = np.random.default_rng(12)
    x, w, b, z = (
        _normal(rng, 2, 16, 7, 9),
        _normal(rng, 12, 16, 3, 3),
        _normal(rng, 12),
        _normal(rng, 2, 12, 7, 9),
    )
    (got,), (expected,) = run_both(
        "FusedConv", flowrt.descriptors.Conv(pads=(1, 1, 1, 1)), [x, w, b, z], constant=(1, 2),
        activation=FusedActivation("Relu"),
    )  # fmt: skip
    np.testing.assert_allclose(got, np.maximum(expected, 0), rtol=1e-4, atol=1e-4)


def _residual_block(with_bias: bool) -> flowrt.Network:
    """x -> Conv + Relu -> Conv -> Add x -> Relu: a ResNet basic block."""
    rng = np.random.default_rng(13)
    net = flowrt.Network()
    x = net.add_input("x", TensorInfo((2, 8, 10, 10)))
    pads = flowrt.descriptors.Conv(pads=(1, 1, 1, 1))
    w1, w2 = (0.2 * _normal(rng, 8, 8, 3, 3) for _ in range(2))
    conv1 = net.add_layer("Conv", pads, [x, w1, _normal(rng, 8)], name="conv1")
    relu1 = net.add_layer("Relu", inputs=[conv1], name="relu1")
    conv2 = net.add_layer(
        "Conv", pads, [relu1, w2, _normal(rng, 8)] if with_bias else [relu1, w2], name="conv2"
    )
    add = net.add_layer("Add", inputs=[conv2, x], name="add")
    net.add_output("y", net.add_layer("Relu", inputs=[add], name="relu2"))
    return net


@pytest.mark.parametrize("with_bias", [True, False])
def test_a_residual_block_runs_as_conv_and_fused_conv_on_gpuacc(gpu, with_bias):
    x = np.random.default_rng(14).standard_normal((2, 8, 10, 10)).astype(np.float32)
    opt = flowrt.optimize(_residual_block(with_bias), backends=["GpuAcc", "CpuRef"])
    layers = opt.graph.layers
    assert layers["conv2"].kind == "FusedConv" and layers["conv2"].backend == "GpuAcc"
    assert "add" not in layers and "relu2" not in layers
    assert layers["conv2"].activation == FusedActivation("Relu")
    assert "GpuAcc: Conv 'conv2' + Add 'add' + Relu 'relu2'" in opt.report()

    async def run(o):
        async with flowrt.Runtime(cpu_workers=1) as rt:
            return (await (await rt.load(o, max_in_flight=1)).run({"x": x}))["y"]

    expected = trio.run(run, flowrt.optimize(_residual_block(with_bias), backends=["CpuRef"]))
    np.testing.assert_allclose(trio.run(run, opt), expected, rtol=1e-4, atol=1e-4)
