"""GpuAcc Conv (im2col + tiled GEMM), Gemm and MatMul against CpuRef."""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

import flowrt
from flowrt.registry import FusedActivation


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
