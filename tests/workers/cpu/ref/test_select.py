"""CpuRef NonZero, Compress, Unique and ReverseSequence against onnx's reference, and their
shape inference."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from oracle import assert_matches_reference, run_flowrt_node

from flowrt.engine.graph.layer_kind import NoDescriptor, get_layer_kind
from flowrt.engine.graph.layers.select import CompressDescriptor, ReverseSequenceDescriptor, UniqueDescriptor
from flowrt.errors import DataTypeError, ShapeError
from flowrt.types import DataType, TensorInfo

dims_strategy = st.lists(st.integers(1, 4), min_size=1, max_size=4)
BOOL = DataType.BOOL


@settings(max_examples=25, deadline=None)
@given(st.lists(st.integers(0, 4), max_size=4), st.sampled_from([np.float32, np.int32, np.bool_]))
def test_nonzero_lists_indices_of_nonzero_elements_matches_reference(dims, dtype):
    x = np.random.default_rng(len(dims)).integers(0, 2, dims).astype(dtype)
    (got,), (info,) = run_flowrt_node("NonZero", [x], opset=13)
    assert_matches_reference("NonZero", [x], opset=13)
    assert info.shape == (len(dims), None) and got.shape == (len(dims), np.count_nonzero(x))


@settings(max_examples=25, deadline=None)
@given(dims_strategy, st.booleans(), st.data())
def test_compress_matches_reference(dims, use_axis, data):
    x = np.arange(np.prod(dims), dtype=np.float32).reshape(dims)
    axis = data.draw(st.integers(-len(dims), len(dims) - 1)) if use_axis else None
    extent = dims[axis] if use_axis else x.size
    condition = np.array(data.draw(st.lists(st.booleans(), max_size=extent)), dtype=bool)
    attributes = {} if axis is None else {"axis": axis}
    assert_matches_reference("Compress", [x, condition], attributes, opset=11)


@settings(max_examples=25, deadline=None)
@given(dims_strategy, st.data())
def test_unique_sorted_along_an_axis_or_flattened_matches_reference(dims, data):
    x = np.random.default_rng(len(dims)).integers(0, 2, dims).astype(np.float32)
    axis = data.draw(st.one_of(st.none(), st.integers(-len(dims), len(dims) - 1)))
    attributes = {"sorted": 1} if axis is None else {"sorted": 1, "axis": axis}
    assert_matches_reference("Unique", [x], attributes, opset=11, num_outputs=4)


@settings(max_examples=25, deadline=None)
@given(st.lists(st.integers(-3, 3), min_size=1, max_size=12))
def test_unique_unsorted_keeps_first_occurrence_order_matches_reference(values):
    # onnx's reference gets unsorted Unique right for 1-D inputs only.
    x = np.array(values, dtype=np.int64)
    y, first, inverse, counts = assert_matches_reference(
        "Unique", [x], {"sorted": 0}, opset=11, num_outputs=4
    )
    np.testing.assert_array_equal(y[inverse], x)


def test_unique_unsorted_along_an_axis_keeps_first_occurrence_order():
    x = np.array([[2, 1, 2, 0], [5, 1, 5, 0]], dtype=np.int32)
    (y, first, inverse, counts), infos = run_flowrt_node(
        "Unique", [x], {"sorted": 0, "axis": 1}, num_outputs=4
    )
    np.testing.assert_array_equal(y, [[2, 1, 0], [5, 1, 0]])
    np.testing.assert_array_equal(first, [0, 1, 3])
    np.testing.assert_array_equal(inverse, [0, 1, 0, 2])
    np.testing.assert_array_equal(counts, [2, 1, 1])
    assert infos[0].shape == (2, None) and infos[2].shape == (4,)


@settings(max_examples=25, deadline=None)
@given(
    st.integers(1, 5), st.integers(1, 4), st.lists(st.integers(1, 3), max_size=2), st.booleans(), st.data()
)
def test_reverse_sequence_matches_reference(steps, batch, rest, time_first, data):
    time_axis = 0 if time_first else 1
    dims = ([steps, batch] if time_first else [batch, steps]) + rest
    x = np.arange(np.prod(dims), dtype=np.float32).reshape(dims)
    lens = np.array(
        data.draw(st.lists(st.integers(0, steps), min_size=batch, max_size=batch)), dtype=np.int64
    )
    attributes = {"time_axis": time_axis, "batch_axis": 1 - time_axis}
    assert_matches_reference("ReverseSequence", [x, lens], attributes, opset=10)


def test_infer_copes_with_unknown_dims_and_ranks():
    assert get_layer_kind("NonZero").infer(NoDescriptor(), [TensorInfo(None)], [None])[0].shape is None
    compress = get_layer_kind("Compress").infer
    cond = TensorInfo((None,), BOOL)
    assert compress(CompressDescriptor(axis=1), [TensorInfo(("N", 4)), cond], [None, None])[0].shape == (
        "N",
        None,
    )
    known = np.array([True, False, True])
    assert compress(CompressDescriptor(), [TensorInfo(("N", 4)), cond], [None, known])[0].shape == (2,)
    outs = get_layer_kind("Unique").infer(UniqueDescriptor(axis=0), [TensorInfo(None)], [None])
    assert outs[0].shape is None and outs[2].shape == (None,)
    reverse = get_layer_kind("ReverseSequence").infer
    lens = TensorInfo((None,), DataType.INT64)
    assert reverse(ReverseSequenceDescriptor(), [TensorInfo(None), lens], [None, None])[0].shape is None


def test_bad_shapes_and_types_raise():
    compress = get_layer_kind("Compress").infer
    with pytest.raises(ShapeError, match="at most 2 values"):
        compress(
            CompressDescriptor(axis=0), [TensorInfo((2, 3)), TensorInfo((3,), BOOL)], [None, np.ones(3, bool)]
        )
    with pytest.raises(DataTypeError, match="condition"):
        compress(CompressDescriptor(), [TensorInfo((2, 3)), TensorInfo((3,))], [None, None])
    reverse = get_layer_kind("ReverseSequence").infer
    with pytest.raises(ShapeError, match="3 sequence_lens expected"):
        reverse(
            ReverseSequenceDescriptor(), [TensorInfo((4, 3)), TensorInfo((2,), DataType.INT64)], [None, None]
        )
    with pytest.raises(ValueError, match="must differ"):
        ReverseSequenceDescriptor(batch_axis=0, time_axis=0)
    with pytest.raises(ShapeError, match="sequence_lens must be in"):
        run_flowrt_node("ReverseSequence", [np.zeros((2, 2), np.float32), np.array([3, 1])])
