"""CpuRef TopK against onnx's reference, and its shape inference."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from oracle import assert_matches_reference, run_flowrt_node

from flowrt.engine.graph.layer_kind import get_layer_kind
from flowrt.engine.graph.layers.topk import TopKDescriptor
from flowrt.errors import ShapeError
from flowrt.types import DataType, TensorInfo

K = TensorInfo((1,), DataType.INT64)


@settings(max_examples=25, deadline=None)
@given(
    st.lists(st.integers(1, 6), min_size=1, max_size=4),
    st.sampled_from([np.float32, np.float64, np.int32, np.int64, np.uint8, np.uint64]),
    st.booleans(),
    st.data(),
)
def test_topk_with_ties_matches_reference(dims, dtype, largest, data):
    axis = data.draw(st.integers(-len(dims), len(dims) - 1))
    k = data.draw(st.integers(0, dims[axis]))
    # Few distinct values: many ties, which must come lowest index first.
    x = np.random.default_rng(sum(dims)).integers(0, 3, dims).astype(dtype)
    attributes = {"axis": axis, "largest": int(largest), "sorted": 1}
    values, indices = assert_matches_reference(
        "TopK", [x, np.array([k], dtype=np.int64)], attributes, opset=11, num_outputs=2
    )
    assert indices.dtype == np.int64 and values.shape[axis] == k


def test_topk_largest_keeps_unsigned_and_minimum_integers_in_order():
    x = np.array([[0, 255, 1, 255]], dtype=np.uint8)
    (values, indices), _ = run_flowrt_node("TopK", [x, np.array([3])], opset=11, num_outputs=2)
    np.testing.assert_array_equal(values, [[255, 255, 1]])
    np.testing.assert_array_equal(indices, [[1, 3, 2]])
    x = np.array([np.iinfo(np.int64).min, 5, np.iinfo(np.int64).min], dtype=np.int64)
    (values, indices), _ = run_flowrt_node("TopK", [x, np.array([3])], opset=11, num_outputs=2)
    np.testing.assert_array_equal(indices, [1, 0, 2])


def test_topk_of_opset_1_takes_k_as_attribute():
    x = np.array([[3.0, 1.0, 2.0], [0.0, 5.0, 4.0]], dtype=np.float32)
    values, _ = assert_matches_reference("TopK", [x], {"k": 2}, opset=1, num_outputs=2)
    np.testing.assert_array_equal(values, [[3.0, 2.0], [5.0, 4.0]])


def test_infer_copes_with_unknown_k_dims_and_rank():
    infer = get_layer_kind("TopK").infer
    values, indices = infer(TopKDescriptor(axis=1), [TensorInfo(("N", None)), K], [None, np.array([3])])
    assert values.shape == ("N", 3) and indices.dtype is DataType.INT64
    assert infer(TopKDescriptor(), [TensorInfo(("N", 8)), K], [None, None])[0].shape == ("N", None)
    assert infer(TopKDescriptor(), [TensorInfo(None), K], [None, np.array([3])])[1].shape is None


def test_k_beyond_the_axis_or_missing_raises():
    infer = get_layer_kind("TopK").infer
    with pytest.raises(ShapeError, match=r"k must be in \[0, 4\]"):
        infer(TopKDescriptor(), [TensorInfo((2, 4)), K], [None, np.array([5])])
    with pytest.raises(ShapeError, match="k expected"):
        infer(TopKDescriptor(), [TensorInfo((2, 4))], [None])
    with pytest.raises(ShapeError, match="out of range"):
        infer(TopKDescriptor(axis=2), [TensorInfo((2, 4)), K], [None, np.array([1])])
