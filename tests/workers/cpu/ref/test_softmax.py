"""CpuRef Softmax, LogSoftmax and Hardmax against onnx's reference, and their shape inference."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from oracle import assert_matches_reference, run_flowrt_node, run_onnx_reference

from flowrt.engine.graph.layer_kind import get_layer_kind
from flowrt.errors import DataTypeError, ShapeError
from flowrt.frontends.onnx.descriptors import make_descriptor
from flowrt.types import DataType, TensorInfo

OPS = ["Softmax", "LogSoftmax", "Hardmax"]


def _infer(op, x, opset=21, **attributes):
    desc = make_descriptor(op, attributes, opset=opset, num_outputs=1)
    return get_layer_kind(op).infer(desc, [x], [None])


def _data(shape, rng):
    # Few distinct values for Hardmax's ties; the others do not mind.
    return rng.integers(-3, 4, size=shape).astype(np.float32) + rng.random(shape, dtype=np.float32) * 0.5


@settings(max_examples=25, deadline=None)
@given(st.sampled_from(OPS), st.lists(st.integers(1, 4), min_size=1, max_size=4), st.data())
def test_softmax_family_any_axis_matches_reference(op, shape, data):
    axis = data.draw(st.none() | st.integers(-len(shape), len(shape) - 1))
    attributes = {} if axis is None else {"axis": axis}
    assert_matches_reference(op, [_data(shape, np.random.default_rng(len(shape)))], attributes, opset=13)


@settings(max_examples=25, deadline=None)
@given(
    st.sampled_from(OPS),
    st.lists(st.integers(1, 4), min_size=1, max_size=4),
    st.data(),
    st.sampled_from([1, 11]),
)
def test_softmax_family_before_opset_13_works_on_the_2d_coercion(op, shape, data, opset):
    rank = len(shape)
    axis = data.draw(st.none() | st.integers(-rank, rank))
    attributes = {} if axis is None else {"axis": axis}
    x = _data(shape, np.random.default_rng(rank))
    (got,), (info,) = run_flowrt_node(op, [x], attributes, opset=opset)
    # The old semantics, as the new op on the [prod(dims[:axis]), prod(dims[axis:])] view.
    split = 1 if axis is None else axis % rank if axis < 0 else axis
    rows = int(np.prod(shape[:split]))
    (expected,) = run_onnx_reference(op, [x.reshape(rows, -1)], {"axis": 1}, opset=13)
    np.testing.assert_allclose(got, expected.reshape(shape), rtol=1e-5, atol=1e-6)
    assert got.dtype == np.float32 and info.shape == tuple(shape)


def test_softmax_default_axis_is_1_before_opset_13_and_last_after():
    x = np.random.default_rng(0).standard_normal((2, 3, 4)).astype(np.float32)
    (old,), _ = run_flowrt_node("Softmax", [x], opset=11)
    (new,), _ = run_flowrt_node("Softmax", [x], opset=13)
    np.testing.assert_allclose(old.sum(axis=(1, 2)), 1.0, rtol=1e-5)
    np.testing.assert_allclose(new.sum(axis=2), 1.0, rtol=1e-5)


def test_softmax_and_log_softmax_are_stable_for_large_inputs():
    x = np.array([[1000.0, 1001.0, 1002.0], [-1e30, 0.0, 1e30]], np.float32)
    (soft,), _ = run_flowrt_node("Softmax", [x])
    (log_soft,), _ = run_flowrt_node("LogSoftmax", [x])
    shifted = np.array([0.0, 1.0, 2.0])
    expected = np.exp(shifted) / np.exp(shifted).sum()
    np.testing.assert_allclose(soft[0], expected, rtol=1e-6)
    np.testing.assert_allclose(log_soft[0], np.log(expected), rtol=1e-6)
    np.testing.assert_allclose(soft[1], [0.0, 0.0, 1.0])
    assert np.isfinite(log_soft[1, 2]) and log_soft[1, 2] == 0.0


def test_hardmax_marks_only_the_first_of_tied_maxima():
    x = np.array([[2.0, 5.0, 5.0, 1.0]], np.float32)
    (got,), _ = run_flowrt_node("Hardmax", [x])
    assert got.tolist() == [[0.0, 1.0, 0.0, 0.0]]


@pytest.mark.parametrize("op", OPS)
def test_softmax_family_keeps_float16(op):
    x = np.random.default_rng(1).standard_normal((2, 5)).astype(np.float16)
    got = assert_matches_reference(op, [x], opset=13, rtol=2e-3, atol=2e-3)
    assert got[0].dtype == np.float16


def test_softmax_family_of_an_empty_tensor_is_empty():
    (got,), _ = run_flowrt_node("Softmax", [np.zeros((0, 3), np.float32)])
    assert got.shape == (0, 3)


def test_softmax_axis_out_of_range_is_a_shape_error():
    x = TensorInfo((2, 3), DataType.FLOAT32)
    with pytest.raises(ShapeError, match="out of range"):
        _infer("Softmax", x, axis=2)
    with pytest.raises(ShapeError, match="out of range"):
        _infer("LogSoftmax", x, opset=11, axis=3)
    # The 2-D coercion before opset 13 admits axis == rank.
    assert _infer("Hardmax", x, opset=11, axis=2)[0].shape == (2, 3)


def test_softmax_refuses_integers():
    with pytest.raises(DataTypeError, match="int64"):
        _infer("Softmax", TensorInfo((2, 3), DataType.INT64))


def test_softmax_infer_copes_with_unknown_dims_and_rank():
    (info,) = _infer("Softmax", TensorInfo((None, "seq", 8), DataType.FLOAT16))
    assert info == TensorInfo((None, "seq", 8), DataType.FLOAT16)
    (info,) = _infer("Hardmax", TensorInfo(None, DataType.FLOAT32), axis=5)
    assert info.shape is None
