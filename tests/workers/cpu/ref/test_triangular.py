"""CpuRef Trilu and EyeLike against onnx's reference, and their shape inference."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from oracle import assert_matches_reference

from flowrt.engine.graph.layer_kind import get_layer_kind
from flowrt.engine.graph.layers.triangular import EyeLikeDescriptor, TriluDescriptor
from flowrt.errors import DataTypeError, ShapeError
from flowrt.types import DataType, TensorInfo

matrix_dims = st.lists(st.integers(1, 5), min_size=2, max_size=4)


@settings(max_examples=25, deadline=None)
@given(matrix_dims, st.sampled_from([0, 1]), st.one_of(st.none(), st.integers(-6, 6)))
def test_trilu_keeps_the_triangle_from_diagonal_k_matches_reference(dims, upper, k):
    x = np.arange(1, np.prod(dims) + 1, dtype=np.float32).reshape(dims)
    inputs = [x] if k is None else [x, np.array(k, dtype=np.int64)]
    assert_matches_reference("Trilu", inputs, {"upper": upper}, opset=14)


def test_trilu_keeps_integer_type():
    x = np.arange(12, dtype=np.int32).reshape(3, 4)
    (got,) = assert_matches_reference("Trilu", [x, np.array(-1)], {"upper": 0}, opset=14)
    assert got[0, 0] == 0 and got[1, 0] == 4


@settings(max_examples=25, deadline=None)
@given(
    st.integers(1, 5),
    st.integers(1, 5),
    st.integers(-5, 5),
    st.sampled_from([None, 1, 6, 7, 9, 11]),  # float, int32, int64, bool, double
)
def test_eye_like_puts_ones_on_diagonal_k_matches_reference(rows, cols, k, dtype):
    attributes = {"k": k} if dtype is None else {"k": k, "dtype": dtype}
    assert_matches_reference("EyeLike", [np.zeros((rows, cols), np.int32)], attributes, opset=22)


def test_infer_copes_with_unknown_dims_and_ranks():
    trilu = get_layer_kind("Trilu").infer
    assert trilu(TriluDescriptor(), [TensorInfo(("N", None, 3))], [None])[0].shape == ("N", None, 3)
    assert trilu(TriluDescriptor(), [TensorInfo(None), None], [None, None])[0].shape is None
    eye = get_layer_kind("EyeLike").infer
    info = eye(EyeLikeDescriptor(dtype=7), [TensorInfo(("R", None))], [None])[0]
    assert info.shape == ("R", None) and info.dtype is DataType.INT64
    assert eye(EyeLikeDescriptor(), [TensorInfo(None)], [None])[0].shape == (None, None)


def test_bad_ranks_and_types_raise():
    with pytest.raises(ShapeError, match="rank 2 or more"):
        get_layer_kind("Trilu").infer(TriluDescriptor(), [TensorInfo((4,))], [None])
    with pytest.raises(ShapeError, match="2-D input"):
        get_layer_kind("EyeLike").infer(EyeLikeDescriptor(), [TensorInfo((2, 2, 2))], [None])
    with pytest.raises(DataTypeError, match="COMPLEX64"):
        get_layer_kind("EyeLike").infer(EyeLikeDescriptor(dtype=14), [TensorInfo((2, 2))], [None])
