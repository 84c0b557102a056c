"""GpuAcc Reduce*, LayerNormalization, Pad and Resize against CpuRef on random shapes."""

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import flowrt
from flowrt.workers.gpu.kernels.reduce import REDUCE_CODES


@st.composite
def reductions(draw):
    shape = draw(hnp.array_shapes(min_dims=1, max_dims=5, max_side=6))
    axes = draw(st.lists(st.integers(-len(shape), len(shape) - 1), unique_by=lambda a: a % len(shape)))
    return shape, tuple(axes), draw(st.integers(0, 1)), draw(st.integers(0, 2**31))


@pytest.mark.parametrize("kind", sorted(REDUCE_CODES))
@settings(max_examples=6, deadline=None)
@given(case=reductions())
def test_reduce_matches_cpuref(run_both, kind, case):
    shape, axes, keepdims, seed = case
    x = np.random.default_rng(seed).standard_normal(shape).astype(np.float32)
    if kind in ("ReduceLogSum", "ReduceProd"):
        x = np.abs(x) + np.float32(0.5)
    desc = flowrt.descriptors.ReduceSum(axes=axes or None, keepdims=keepdims)
    (got,), (expected,) = run_both(kind, desc, [x])
    assert got.shape == expected.shape
    # Two float32 sums of the same terms in other orders differ by the roundings of their
    # partial sums, which scale with the terms' sizes, not with the result: a sum that cancels
    # (1875 terms adding up to 1.21, 4.9e-5 apart) is outside tolerances of its own size, so
    # the bound also grows with the sum of the terms' sizes (1e-6 of it, 8 float32 epsilons).
    terms = float(np.abs(x).sum(axis=tuple(axes) or None).max())
    np.testing.assert_allclose(got, expected, rtol=2e-5, atol=2e-5 + 1e-6 * terms)


def test_reduce_mean_with_an_axes_input(run_both):
    x = np.random.default_rng(1).standard_normal((2, 3, 5)).astype(np.float32)
    axes = np.array([0, 2], np.int64)
    (got,), (expected,) = run_both("ReduceMean", flowrt.descriptors.ReduceMean(), [x, axes], constant=(1,))
    assert got.shape == (1, 3, 1)
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)


@settings(max_examples=15, deadline=None)
@given(
    shape=hnp.array_shapes(min_dims=1, max_dims=4, max_side=9),
    axis=st.integers(-4, 3),
    outputs=st.integers(1, 3),
    seed=st.integers(0, 2**31),
)
def test_layer_normalization_matches_cpuref(run_both, shape, axis, outputs, seed):
    axis = axis % len(shape)
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal(shape) * 3 + 1).astype(np.float32)
    scale, bias = (rng.standard_normal(shape[axis:]).astype(np.float32) for _ in range(2))
    desc = flowrt.descriptors.LayerNormalization(axis=axis, epsilon=1e-3, num_outputs=outputs)
    got, expected = run_both("LayerNormalization", desc, [x, scale, bias], constant=(1, 2))
    assert len(got) == outputs
    for g, e in zip(got, expected, strict=True):
        np.testing.assert_allclose(g, e.reshape(g.shape), rtol=1e-4, atol=1e-5)


@st.composite
def paddings(draw):
    shape = draw(hnp.array_shapes(min_dims=1, max_dims=4, max_side=5))
    mode = draw(st.sampled_from(["constant", "reflect", "edge", "wrap"]))
    low = 0 if mode != "constant" else -1
    # numpy's reflect needs pads below the dim; the others may grow any amount.
    high = [d - 1 if mode == "reflect" else 4 for d in shape]
    begins = [draw(st.integers(min(low, 0), max(h, 0))) for h in high]
    ends = [draw(st.integers(min(low, 0), max(h, 0))) for h in high]
    assume(all(d + b + e > 0 for d, b, e in zip(shape, begins, ends)))  # GpuAcc takes no empty output
    return shape, mode, begins + ends, draw(st.integers(0, 2**31))


@settings(max_examples=30, deadline=None)
@given(case=paddings())
def test_pad_matches_cpuref(run_both, case):
    shape, mode, pads, seed = case
    x = np.random.default_rng(seed).standard_normal(shape).astype(np.float32)
    inputs = [x, np.array(pads, np.int64), np.array([1.5], np.float32)]
    (got,), (expected,) = run_both("Pad", flowrt.descriptors.Pad(mode=mode), inputs, constant=(1, 2))
    np.testing.assert_array_equal(got, expected)


def test_pad_with_axes_input_and_crop(run_both):
    x = np.arange(2 * 5 * 4, dtype=np.float32).reshape(2, 5, 4)
    pads, axes = np.array([2, -1, 1, 3], np.int64), np.array([1, 2], np.int64)
    (got,), (expected,) = run_both(
        "Pad",
        flowrt.descriptors.Pad(mode="edge"),
        [x, pads, np.zeros(0, np.float32), axes],
        constant=(1, 2, 3),
    )
    assert got.shape == (2, 8, 6)
    np.testing.assert_array_equal(got, expected)


@st.composite
def resizes(draw):
    mode = draw(st.sampled_from(["nearest", "linear", "cubic"]))
    transform = draw(
        st.sampled_from(
            ["half_pixel", "pytorch_half_pixel", "align_corners", "asymmetric", "tf_crop_and_resize"]
        )
    )
    shape = (
        draw(st.integers(1, 2)),
        draw(st.integers(1, 3)),
        draw(st.integers(1, 7)),
        draw(st.integers(1, 7)),
    )
    scales = [1.0, 1.0] + [draw(st.sampled_from([0.5, 0.75, 1.0, 1.5, 2.0, 3.0])) for _ in range(2)]
    return mode, transform, shape, scales, draw(st.integers(0, 1)), draw(st.integers(0, 2**31))


@settings(max_examples=30, deadline=None)
@given(case=resizes())
def test_resize_matches_cpuref(run_both, case):
    mode, transform, shape, scales, antialias, seed = case
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(shape).astype(np.float32)
    roi = np.array([0, 0, 0.1, 0.2, 1, 1, 0.9, 0.7], np.float32)
    desc = flowrt.descriptors.Resize(
        mode=mode,
        coordinate_transformation_mode=transform,
        antialias=antialias if mode != "nearest" else 0,
        extrapolation_value=-3.0,
    )
    inputs = [x, roi, np.array(scales, np.float32)]
    expected_shape = tuple(int(np.floor(d * s)) for d, s in zip(shape, scales))
    if 0 in expected_shape:
        return
    (got,), (expected,) = run_both("Resize", desc, inputs, constant=(1, 2))
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)


def test_resize_to_sizes_and_upsample(run_both):
    x = np.random.default_rng(3).standard_normal((1, 2, 5, 3)).astype(np.float32)
    sizes = np.array([1, 2, 9, 7], np.int64)
    desc = flowrt.descriptors.Resize(mode="linear")
    empty = np.zeros(0, np.float32)
    (got,), (expected,) = run_both("Resize", desc, [x, empty, empty, sizes], constant=(1, 2, 3))
    assert got.shape == (1, 2, 9, 7)
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)
    scales = np.array([1, 1, 2, 3], np.float32)
    (got,), (expected,) = run_both("Upsample", flowrt.descriptors.Upsample(), [x, scales], constant=(1,))
    np.testing.assert_array_equal(got, expected)
