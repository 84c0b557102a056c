"""CpuRef Concat and Split against onnx's reference, and their shape inference."""

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from oracle import assert_matches_reference, run_flowrt_node

from flowrt.engine.graph.layer_kind import get_layer_kind
from flowrt.errors import DataTypeError, ModelLoadError, ShapeError
from flowrt.frontends.onnx.descriptors import make_descriptor
from flowrt.types import DataType, TensorInfo


def _infer(op, inputs, consts, opset=21, num_outputs=1, **attributes):
    desc = make_descriptor(op, attributes, opset=opset, num_outputs=num_outputs)
    return get_layer_kind(op).infer(desc, inputs, consts)


@settings(max_examples=25, deadline=None)
@given(st.lists(st.integers(1, 4), min_size=1, max_size=4), st.data())
def test_concat_any_axis_and_count_matches_reference(dims, data):
    axis = data.draw(st.integers(-len(dims), len(dims) - 1))
    lengths = data.draw(st.lists(st.integers(0, 3), min_size=1, max_size=4))
    rng = np.random.default_rng(2)
    inputs = []
    for n in lengths:
        shape = list(dims)
        shape[axis] = n
        inputs.append(rng.standard_normal(shape).astype(np.float32))
    assert_matches_reference("Concat", inputs, {"axis": axis})


def test_concat_defaults_to_axis_1_before_opset_4():
    a, b = np.ones((2, 1), np.float32), np.zeros((2, 2), np.float32)
    (got,), (info,) = run_flowrt_node("Concat", [a, b], opset=1)
    np.testing.assert_array_equal(got, np.concatenate([a, b], axis=1))
    assert info.shape == (2, 3)
    with pytest.raises(ModelLoadError, match="axis"):
        make_descriptor("Concat", {}, opset=4, num_outputs=1)


@settings(max_examples=25, deadline=None)
@given(st.lists(st.integers(1, 4), min_size=1, max_size=3), st.data(), st.sampled_from([11, 13, 18]))
def test_split_by_given_lengths_matches_reference(dims, data, opset):
    axis = data.draw(st.integers(-len(dims), len(dims) - 1))
    dims[axis] = data.draw(st.integers(1, 7))
    cuts = sorted(data.draw(st.lists(st.integers(0, dims[axis]), max_size=3)))
    split = np.diff([0, *cuts, dims[axis]]).tolist()
    x = np.arange(np.prod(dims), dtype=np.float32).reshape(dims)
    if opset == 11:
        assert_matches_reference(
            "Split", [x], {"axis": axis, "split": split}, opset=opset, num_outputs=len(split)
        )
    else:
        split_input = np.array(split, dtype=np.int64)
        assert_matches_reference(
            "Split", [x, split_input], {"axis": axis}, opset=opset, num_outputs=len(split)
        )


@settings(max_examples=25, deadline=None)
@given(st.integers(1, 9), st.integers(1, 4))
def test_split_into_equal_pieces_last_smaller_matches_reference(length, count):
    x = np.arange(length * 2, dtype=np.int32).reshape(2, length)
    count = min(count, length)
    assume(-(-length // count) * (count - 1) < length)  # else the last output would be empty
    attributes = {"axis": 1, "num_outputs": count}
    assert_matches_reference("Split", [x], attributes, opset=18, num_outputs=count)


def test_concat_infers_merged_and_unknown_dims():
    a, b = TensorInfo(("N", 3, None)), TensorInfo((None, 3, 5))
    (info,) = _infer("Concat", [a, b], [None, None], axis=1)
    assert info.shape == ("N", 6, 5)
    (info,) = _infer("Concat", [a, TensorInfo(None)], [None, None], axis=-1)
    assert info.shape == ("N", 3, None)


def test_split_infers_unknown_lengths_from_computed_split():
    x = TensorInfo(("N", 6))
    split = TensorInfo((2,), DataType.INT64)
    infos = _infer("Split", [x, split], [None, None], opset=13, num_outputs=2, axis=1)
    assert [i.shape for i in infos] == [("N", None), ("N", None)]
    infos = _infer("Split", [x, split], [None, np.array([2, 4])], opset=13, num_outputs=2, axis=1)
    assert [i.shape for i in infos] == [("N", 2), ("N", 4)]
    infos = _infer("Split", [TensorInfo(None)], [None], opset=18, num_outputs=3)
    assert [i.shape for i in infos] == [None, None, None]


def test_mismatched_concat_and_split_raise():
    with pytest.raises(ShapeError, match="agree on dim 0"):
        _infer("Concat", [TensorInfo((2, 3)), TensorInfo((4, 3))], [None, None], axis=1)
    with pytest.raises(DataTypeError, match="one data type"):
        _infer("Concat", [TensorInfo((2, 3)), TensorInfo((2, 3), DataType.INT64)], [None, None], axis=0)
    with pytest.raises(ShapeError, match="one rank"):
        _infer("Concat", [TensorInfo((2, 3)), TensorInfo((2,))], [None, None], axis=0)
    with pytest.raises(ShapeError, match="must sum to the axis dim 6"):
        _infer(
            "Split",
            [TensorInfo((6,)), TensorInfo((2,), DataType.INT64)],
            [None, np.array([2, 3])],
            num_outputs=2,
        )
    with pytest.raises(ShapeError, match="2 split lengths expected"):
        _infer("Split", [TensorInfo((6,))], [None], opset=11, num_outputs=2, split=[1, 2, 3])
