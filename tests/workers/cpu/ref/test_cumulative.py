"""CpuRef CumSum and CumProd against onnx's reference, and their shape inference."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from oracle import assert_matches_reference, run_flowrt_node

from flowrt.engine.graph.layer_kind import get_layer_kind
from flowrt.engine.graph.layers.cumulative import CumulativeDescriptor
from flowrt.errors import DataTypeError, ShapeError
from flowrt.types import DataType, TensorInfo

AXIS = TensorInfo((), DataType.INT64)


@settings(max_examples=25, deadline=None)
@given(
    st.lists(st.integers(1, 5), min_size=1, max_size=4),
    st.sampled_from(["CumSum", "CumProd"]),
    st.sampled_from([np.float32, np.float64, np.int32, np.int64, np.uint64]),
    st.booleans(),
    st.booleans(),
    st.data(),
)
def test_running_sum_and_product_match_reference(dims, op, dtype, exclusive, reverse, data):
    axis = data.draw(st.integers(-len(dims), len(dims) - 1))
    # Small values keep integer products from overflowing.
    x = np.random.default_rng(len(dims)).integers(0, 4, dims).astype(dtype)
    axis_input = np.array(axis, dtype=data.draw(st.sampled_from([np.int32, np.int64])))
    attributes = {"exclusive": int(exclusive), "reverse": int(reverse)}
    (got,) = assert_matches_reference(op, [x, axis_input], attributes, opset=26 if op == "CumProd" else 14)
    assert got.dtype == dtype


def test_exclusive_reverse_cumsum_starts_from_zero_at_the_end():
    x = np.array([1.0, 2.0, 3.0], dtype=np.float32)
    (got,) = assert_matches_reference("CumSum", [x, np.array(0)], {"exclusive": 1, "reverse": 1}, opset=14)
    np.testing.assert_array_equal(got, [5.0, 3.0, 0.0])


def test_axis_given_as_one_element_vector_is_accepted():
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    (got,), (info,) = run_flowrt_node("CumSum", [x, np.array([-1])], opset=14)
    np.testing.assert_array_equal(got, np.cumsum(x, axis=1))
    assert info.shape == (2, 3)


def test_infer_copes_with_unknown_dims_and_axis():
    infer = get_layer_kind("CumSum").infer
    assert infer(CumulativeDescriptor(), [TensorInfo(("N", None)), AXIS], [None, None])[0].shape == (
        "N",
        None,
    )
    assert infer(CumulativeDescriptor(), [TensorInfo(None), AXIS], [None, np.array(5)])[0].shape is None


def test_bad_axis_and_types_raise():
    infer = get_layer_kind("CumProd").infer
    with pytest.raises(ShapeError, match="out of range"):
        infer(CumulativeDescriptor(), [TensorInfo((2, 3)), AXIS], [None, np.array(2)])
    with pytest.raises(DataTypeError, match="int8"):
        infer(CumulativeDescriptor(), [TensorInfo((2, 3), DataType.INT8), AXIS], [None, None])
    with pytest.raises(DataTypeError, match="axis"):
        infer(CumulativeDescriptor(), [TensorInfo((2, 3)), TensorInfo((), DataType.FLOAT32)], [None, None])
