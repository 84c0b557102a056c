"""GpuAcc pooling, BatchNormalization, LRN and Softmax against CpuRef."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import flowrt
from flowrt.registry import FusedActivation


@st.composite
def pools(draw):
    kh, kw = draw(st.integers(1, 4)), draw(st.integers(1, 4))
    pads = (draw(st.integers(0, kh - 1)), draw(st.integers(0, kw - 1)))
    pads = pads + (draw(st.integers(0, kh - 1)), draw(st.integers(0, kw - 1)))
    shape = (
        draw(st.integers(1, 2)),
        draw(st.integers(1, 3)),
        draw(st.integers(kh, 13)),
        draw(st.integers(kw, 13)),
    )
    common = {
        "kernel_shape": (kh, kw),
        "strides": (draw(st.integers(1, 3)), draw(st.integers(1, 3))),
        "pads": pads,
        "ceil_mode": draw(st.integers(0, 1)),
    }
    return shape, common, draw(st.integers(0, 1)), draw(st.integers(0, 2**31))


@settings(max_examples=15, deadline=None)
@given(case=pools(), kind=st.sampled_from(["MaxPool", "AveragePool"]))
def test_pools_match_cpuref(run_both, case, kind):
    shape, common, include_pad, seed = case
    x = np.random.default_rng(seed).standard_normal(shape).astype(np.float32)
    extra = {"count_include_pad": include_pad} if kind == "AveragePool" else {}
    desc = getattr(flowrt.descriptors, kind)(**common, **extra)
    (got,), (expected,) = run_both(kind, desc, [x])
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)


def test_max_pool_with_dilations(run_both):
    x = np.random.default_rng(6).standard_normal((1, 2, 11, 10)).astype(np.float32)
    desc = flowrt.descriptors.MaxPool(kernel_shape=(3, 2), dilations=(2, 3), strides=(1, 2))
    (got,), (expected,) = run_both("MaxPool", desc, [x])
    np.testing.assert_array_equal(got, expected)


def test_global_average_pool_matches_cpuref(run_both):
    x = np.random.default_rng(7).standard_normal((2, 5, 13, 7)).astype(np.float32)
    (got,), (expected,) = run_both("GlobalAveragePool", flowrt.descriptors.GlobalAveragePool(), [x])
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("constant", [(1, 2, 3, 4), ()])
def test_batch_normalization_matches_cpuref_with_fused_relu(run_both, constant):
    rng = np.random.default_rng(8)
    x = rng.standard_normal((2, 4, 5, 3)).astype(np.float32)
    scale, bias, mean = (rng.standard_normal(4).astype(np.float32) for _ in range(3))
    var = rng.random(4).astype(np.float32)
    desc = flowrt.descriptors.BatchNormalization(epsilon=1e-3)
    (got,), (expected,) = run_both(
        "BatchNormalization", desc, [x, scale, bias, mean, var], constant, FusedActivation("Relu")
    )
    np.testing.assert_allclose(got, np.maximum(expected, 0), rtol=1e-5, atol=1e-6)


@settings(max_examples=15, deadline=None)
@given(
    x=hnp.arrays(
        np.float32, hnp.array_shapes(min_dims=2, max_dims=4, max_side=9), elements=st.floats(-5, 5, width=32)
    ),
    size=st.integers(1, 6),
    alpha=st.sampled_from([1e-4, 0.5]),
    beta=st.sampled_from([0.75, 1.0]),
)
def test_lrn_matches_cpuref(run_both, x, size, alpha, beta):
    desc = flowrt.descriptors.LRN(size=size, alpha=alpha, beta=beta, bias=2.0)
    (got,), (expected,) = run_both("LRN", desc, [x])
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)


@settings(max_examples=15, deadline=None)
@given(
    x=hnp.arrays(
        np.float32,
        hnp.array_shapes(min_dims=1, max_dims=4, max_side=9),
        elements=st.floats(-30, 30, width=32),
    ),
    axis=st.integers(-4, 3),
    opset=st.sampled_from([11, 13]),
)
def test_softmax_matches_cpuref(run_both, x, axis, opset):
    axis = axis % x.ndim
    (got,), (expected,) = run_both("Softmax", flowrt.descriptors.Softmax(axis=axis, opset=opset), [x])
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-7)
