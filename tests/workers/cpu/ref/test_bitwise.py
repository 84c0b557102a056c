"""CpuRef BitwiseAnd/Or/Xor/Not against onnx's reference, and their shape inference."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from oracle import assert_matches_reference

from flowrt.engine.graph.layer_kind import NoDescriptor, get_layer_kind
from flowrt.errors import DataTypeError, ShapeError
from flowrt.types import DataType, TensorInfo

INT_DTYPES = [np.int8, np.uint8, np.int16, np.uint16, np.int32, np.uint32, np.int64, np.uint64]


def _random_ints(rng, dims, dtype):
    info = np.iinfo(dtype)
    return rng.integers(info.min, info.max, dims, dtype=dtype, endpoint=True)


@settings(max_examples=25, deadline=None)
@given(
    st.sampled_from(["BitwiseAnd", "BitwiseOr", "BitwiseXor"]),
    st.sampled_from(INT_DTYPES),
    st.lists(st.integers(1, 4), min_size=1, max_size=4),
    st.data(),
)
def test_binary_bitwise_ops_broadcast_and_match_reference(op, dtype, dims, data):
    rng = np.random.default_rng(len(dims))
    # B takes a suffix of A's dims, some of them 1.
    b_dims = [data.draw(st.sampled_from([1, d])) for d in dims[data.draw(st.integers(0, len(dims))) :]]
    a, b = _random_ints(rng, dims, dtype), _random_ints(rng, b_dims, dtype)
    (got,) = assert_matches_reference(op, [a, b], opset=18)
    assert got.dtype == dtype


@settings(max_examples=25, deadline=None)
@given(st.sampled_from(INT_DTYPES), st.lists(st.integers(1, 4), max_size=4))
def test_bitwise_not_matches_reference(dtype, dims):
    x = _random_ints(np.random.default_rng(len(dims)), dims, dtype)
    assert_matches_reference("BitwiseNot", [x], opset=18)


def test_infer_copes_with_unknown_dims():
    infer = get_layer_kind("BitwiseAnd").infer
    a, b = TensorInfo(("N", 3), DataType.INT32), TensorInfo((1, None), DataType.INT32)
    assert infer(NoDescriptor(), [a, b], [None, None])[0].shape == ("N", 3)
    none = TensorInfo(None, DataType.UINT8)
    assert get_layer_kind("BitwiseNot").infer(NoDescriptor(), [none], [None])[0] == none


def test_float_mixed_and_unbroadcastable_inputs_raise():
    infer = get_layer_kind("BitwiseOr").infer
    with pytest.raises(DataTypeError, match="float32"):
        infer(NoDescriptor(), [TensorInfo((2,)), TensorInfo((2,))], [None, None])
    with pytest.raises(DataTypeError, match="one data type"):
        infer(
            NoDescriptor(), [TensorInfo((2,), DataType.INT32), TensorInfo((2,), DataType.INT64)], [None, None]
        )
    with pytest.raises(ShapeError, match="cannot be broadcast"):
        infer(
            NoDescriptor(), [TensorInfo((2,), DataType.INT8), TensorInfo((3,), DataType.INT8)], [None, None]
        )
