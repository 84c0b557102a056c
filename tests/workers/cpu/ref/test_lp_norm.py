"""CpuRef LpNormalization, Shrink and Swish against onnx's reference, and their shape inference."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from oracle import assert_matches_reference, run_flowrt_node

from flowrt.engine.graph.layer_kind import get_layer_kind
from flowrt.engine.graph.layers.lp_norm import LpNormalizationDescriptor, ShrinkDescriptor
from flowrt.errors import DataTypeError, ShapeError
from flowrt.types import DataType, TensorInfo

dims_strategy = st.lists(st.integers(1, 5), min_size=1, max_size=4)


@settings(max_examples=25, deadline=None)
@given(dims_strategy, st.sampled_from([1, 2]), st.sampled_from([np.float32, np.float64]), st.data())
def test_lp_normalization_divides_by_the_norm(dims, p, dtype, data):
    axis = data.draw(st.integers(-len(dims), len(dims) - 1))
    x = np.random.default_rng(len(dims)).standard_normal(dims).astype(dtype)
    attributes = {"axis": axis, "p": p}
    # onnx's reference sums x (not |x|) for p=1, so it is the oracle only for p=2.
    if p == 2:
        assert_matches_reference("LpNormalization", [x], attributes, rtol=1e-5)
    (got,), (info,) = run_flowrt_node("LpNormalization", [x], attributes)
    norm = np.sum(np.abs(x) ** p, axis=axis, keepdims=True) ** (1 / p)
    np.testing.assert_allclose(got, x / norm, rtol=1e-5)
    assert got.dtype == dtype and info == TensorInfo.of(x)


def test_lp_normalization_of_a_zero_row_is_zero():
    x = np.array([[0.0, 0.0], [3.0, -4.0]], dtype=np.float32)
    (got,) = assert_matches_reference("LpNormalization", [x], {"axis": 1})
    np.testing.assert_allclose(got, [[0.0, 0.0], [0.6, -0.8]], rtol=1e-6)


@settings(max_examples=25, deadline=None)
@given(
    dims_strategy,
    st.sampled_from([np.float32, np.float16, np.int32, np.int8]),
    st.floats(0, 3, width=32),
    st.floats(0, 3, width=32),
)
def test_shrink_matches_reference(dims, dtype, bias, lambd):
    x = np.random.default_rng(len(dims)).uniform(-5, 5, dims).astype(dtype)
    assert_matches_reference("Shrink", [x], {"bias": bias, "lambd": lambd}, opset=9, rtol=1e-3)


@settings(max_examples=25, deadline=None)
@given(dims_strategy, st.floats(-2, 2, width=32), st.sampled_from([np.float32, np.float64, np.float16]))
def test_swish_matches_reference(dims, alpha, dtype):
    x = np.random.default_rng(len(dims)).uniform(-30, 30, dims).astype(dtype)
    # flowrt rounds float16 once, the reference twice: allow float16's precision.
    rtol = 1e-3 if dtype == np.float16 else 1e-5
    assert_matches_reference("Swish", [x], {"alpha": alpha}, opset=24, rtol=rtol, atol=1e-6)


def test_infer_copes_with_unknown_dims_and_rank():
    info = TensorInfo(("N", None, 3))
    assert get_layer_kind("LpNormalization").infer(LpNormalizationDescriptor(axis=1), [info], [None]) == [
        info
    ]
    assert get_layer_kind("Shrink").infer(ShrinkDescriptor(), [TensorInfo(None)], [None])[0].shape is None


def test_bad_axis_p_and_types_raise():
    infer = get_layer_kind("LpNormalization").infer
    with pytest.raises(ShapeError, match="out of range"):
        infer(LpNormalizationDescriptor(axis=3), [TensorInfo((2, 3))], [None])
    with pytest.raises(DataTypeError, match="int32"):
        infer(LpNormalizationDescriptor(), [TensorInfo((2, 3), DataType.INT32)], [None])
    with pytest.raises(ValueError):
        LpNormalizationDescriptor(p=3)
