"""CpuRef Shape, Size, ConstantOfShape, Range and OneHot against onnx's reference, and their inference."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import helper
from oracle import assert_matches_reference, run_flowrt_node

from flowrt.engine.graph.layer_kind import get_layer_kind
from flowrt.errors import DataTypeError, ModelLoadError, ShapeError
from flowrt.frontends.onnx.descriptors import make_descriptor
from flowrt.types import DataType, TensorInfo

dims_strategy = st.lists(st.integers(0, 4), max_size=4)
SCALAR = TensorInfo((), DataType.INT64)


def _infer(op, inputs, consts, opset=21, **attributes):
    desc = make_descriptor(op, attributes, opset=opset, num_outputs=1)
    return get_layer_kind(op).infer(desc, inputs, consts)[0]


@settings(max_examples=25, deadline=None)
@given(dims_strategy, st.data())
def test_shape_with_start_and_end_matches_reference(dims, data):
    x = np.zeros(dims, dtype=np.float32)
    attributes = {}
    # onnx's reference clamps only indices past the end; those before the start are tested below.
    if data.draw(st.booleans()):
        attributes["start"] = data.draw(st.integers(-len(dims), 6))
    if data.draw(st.booleans()):
        attributes["end"] = data.draw(st.integers(-len(dims), 6))
    got = assert_matches_reference("Shape", [x], attributes, opset=15)
    assert got[0].dtype == np.int64


def test_shape_clamps_start_and_end_before_the_first_dim():
    x = np.zeros((2, 3, 4), dtype=np.float32)
    (got,), (info,) = run_flowrt_node("Shape", [x], {"start": -9, "end": -5}, opset=15)
    assert got.tolist() == [] and info.shape == (0,)
    (got,), _ = run_flowrt_node("Shape", [x], {"start": -10, "end": 2}, opset=15)
    assert got.tolist() == [2, 3]


@settings(max_examples=25, deadline=None)
@given(dims_strategy)
def test_size_matches_reference(dims):
    assert_matches_reference("Size", [np.zeros(dims, dtype=np.int8)])


@settings(max_examples=25, deadline=None)
@given(dims_strategy, st.sampled_from([None, np.float32, np.int32, np.int64, np.float16, np.bool_]))
def test_constant_of_shape_matches_reference(dims, value_type):
    attributes = {}
    if value_type is not None:
        attributes["value"] = helper.make_tensor(
            "value", helper.np_dtype_to_tensor_dtype(np.dtype(value_type)), [1], [1]
        )
    assert_matches_reference("ConstantOfShape", [np.array(dims, dtype=np.int64)], attributes)


@settings(max_examples=25, deadline=None)
@given(
    st.sampled_from([np.float32, np.float64, np.int32, np.int64, np.int16]),
    st.integers(-20, 20),
    st.integers(-20, 20),
    st.integers(-5, 5).filter(bool),
)
def test_range_matches_reference(dtype, start, limit, delta):
    scale = 0.5 if np.dtype(dtype).kind == "f" else 1
    values = [np.array(v * scale, dtype=dtype) for v in (start, limit, delta)]
    assert_matches_reference("Range", values)


@settings(max_examples=25, deadline=None)
@given(st.lists(st.integers(1, 3), max_size=3), st.integers(1, 5), st.data())
def test_one_hot_with_negative_and_out_of_range_indices_matches_reference(dims, depth, data):
    count = int(np.prod(dims))
    indices = np.array(data.draw(st.lists(st.integers(-depth - 1, depth), min_size=count, max_size=count)))
    axis = data.draw(st.integers(-len(dims) - 1, len(dims)))
    index_type = data.draw(st.sampled_from([np.int64, np.int32, np.float32]))
    values = np.array([-1.0, 3.0], dtype=np.float32)
    inputs = [indices.reshape(dims).astype(index_type), np.array(depth, dtype=np.int64), values]
    assert_matches_reference("OneHot", inputs, {"axis": axis})


def test_infer_gives_exact_shape_lengths_and_unknown_values():
    assert _infer("Shape", [TensorInfo(("N", 3, None))], [None]).shape == (3,)
    assert _infer("Shape", [TensorInfo(("N", 3, None))], [None], opset=15, start=1, end=-1).shape == (1,)
    assert _infer("Shape", [TensorInfo(None)], [None]).shape == (None,)
    assert _infer("Size", [TensorInfo(None)], [None]).shape == ()
    shape = TensorInfo((3,), DataType.INT64)
    assert _infer("ConstantOfShape", [shape], [None]) == TensorInfo((None, None, None), DataType.FLOAT32)
    assert _infer("ConstantOfShape", [shape], [np.array([2, 0, 1])]).shape == (2, 0, 1)
    assert _infer("Range", [SCALAR] * 3, [np.array(1), None, np.array(2)]).shape == (None,)
    assert _infer("Range", [SCALAR] * 3, [np.array(1), np.array(10), np.array(4)]).shape == (3,)
    hot = [TensorInfo(("N", 2), DataType.INT64), SCALAR, TensorInfo((2,))]
    assert _infer("OneHot", hot, [None, None, None], axis=1).shape == ("N", None, 2)
    assert _infer("OneHot", hot, [None, np.array(7), None]).shape == ("N", 2, 7)


def test_bad_shape_values_raise():
    with pytest.raises(ShapeError, match="delta may not be 0"):
        _infer("Range", [SCALAR] * 3, [np.array(1), np.array(3), np.array(0)])
    with pytest.raises(DataTypeError, match="of one type"):
        _infer("Range", [SCALAR, SCALAR, TensorInfo((), DataType.INT32)], [None] * 3)
    with pytest.raises(ShapeError, match=">= 0"):
        _infer("ConstantOfShape", [TensorInfo((2,), DataType.INT64)], [np.array([2, -1])])
    with pytest.raises(ModelLoadError, match="one element"):
        make_descriptor("ConstantOfShape", {"value": np.zeros(2, np.float32)}, opset=21, num_outputs=1)
