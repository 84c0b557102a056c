"""CpuRef Slice, Gather, GatherElements and GatherND against onnx's reference, and their shape inference."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from oracle import assert_matches_reference, run_flowrt_node

from flowrt.engine.graph.layer_kind import get_layer_kind
from flowrt.errors import DataTypeError, ShapeError
from flowrt.frontends.onnx.descriptors import make_descriptor
from flowrt.types import DataType, TensorInfo

INT_MAX = 2**63 - 1
dims_strategy = st.lists(st.integers(1, 5), min_size=1, max_size=4)
index_values = st.one_of(st.integers(-7, 7), st.sampled_from([INT_MAX, -INT_MAX, 2**31 - 1]))


def _infer(op, inputs, consts, opset=21, **attributes):
    desc = make_descriptor(op, attributes, opset=opset, num_outputs=1)
    return get_layer_kind(op).infer(desc, inputs, consts)[0]


def _ints(values):
    return np.array(values, dtype=np.int64)


@settings(max_examples=25, deadline=None)
@given(dims_strategy, st.data())
def test_slice_with_negative_clamped_and_stepped_indices_matches_reference(dims, data):
    axes = data.draw(
        st.lists(st.integers(-len(dims), len(dims) - 1), min_size=1, unique_by=lambda a: a % len(dims))
    )
    n = len(axes)
    starts = data.draw(st.lists(index_values, min_size=n, max_size=n))
    ends = data.draw(st.lists(index_values, min_size=n, max_size=n))
    steps = data.draw(st.lists(st.sampled_from([-3, -2, -1, 1, 2, 3]), min_size=n, max_size=n))
    x = np.arange(np.prod(dims), dtype=np.float32).reshape(dims)
    assert_matches_reference("Slice", [x, _ints(starts), _ints(ends), _ints(axes), _ints(steps)], opset=13)


def test_slice_attributes_before_opset_10_match_reference():
    x = np.arange(60, dtype=np.float32).reshape(3, 4, 5)
    assert_matches_reference("Slice", [x], {"starts": [1, -3], "ends": [1000, -1], "axes": [0, 2]}, opset=9)
    assert_matches_reference("Slice", [x], {"starts": [0, 1], "ends": [2, 3]}, opset=1)


def test_slice_default_axes_and_steps_match_reference():
    x = np.arange(60, dtype=np.int32).reshape(3, 4, 5)
    assert_matches_reference("Slice", [x, _ints([1, 0]), _ints([3, -1])], opset=13)


@settings(max_examples=25, deadline=None)
@given(dims_strategy, st.lists(st.integers(1, 3), max_size=2), st.data())
def test_gather_with_negative_indices_matches_reference(dims, index_dims, data):
    axis = data.draw(st.integers(-len(dims), len(dims) - 1))
    n = dims[axis]
    indices = data.draw(
        st.lists(st.integers(-n, n - 1), min_size=int(np.prod(index_dims)), max_size=int(np.prod(index_dims)))
    )
    x = np.arange(np.prod(dims), dtype=np.float32).reshape(dims)
    index_type = data.draw(st.sampled_from([np.int32, np.int64]))
    assert_matches_reference("Gather", [x, np.array(indices, index_type).reshape(index_dims)], {"axis": axis})


def _gather_elements_indices(data, dims, axis, smaller):
    index_dims = [data.draw(st.integers(1, d)) if smaller else d for d in dims]
    index_dims[axis] = data.draw(st.integers(1, 4))
    n = dims[axis]
    count = int(np.prod(index_dims))
    return np.array(data.draw(st.lists(st.integers(-n, n - 1), min_size=count, max_size=count))).reshape(
        index_dims
    )


@settings(max_examples=25, deadline=None)
@given(dims_strategy, st.data())
def test_gather_elements_matches_reference(dims, data):
    # onnx's reference takes neither a negative axis nor indices shorter than the data off the axis.
    axis = data.draw(st.integers(0, len(dims) - 1))
    indices = _gather_elements_indices(data, dims, axis, smaller=False)
    x = np.arange(np.prod(dims), dtype=np.float32).reshape(dims)
    assert_matches_reference("GatherElements", [x, indices.astype(np.int64)], {"axis": axis})


@settings(max_examples=25, deadline=None)
@given(dims_strategy, st.data())
def test_gather_elements_with_negative_axis_and_smaller_indices_picks_per_element(dims, data):
    axis = data.draw(st.integers(-len(dims), -1))
    indices = _gather_elements_indices(data, dims, axis, smaller=True)
    x = np.arange(np.prod(dims), dtype=np.float32).reshape(dims)
    (got,), (info,) = run_flowrt_node("GatherElements", [x, indices], {"axis": axis})
    expected = np.empty(indices.shape, np.float32)
    for position in np.ndindex(*indices.shape):
        source = list(position)
        source[axis] = indices[position]
        expected[position] = x[tuple(source)]
    np.testing.assert_array_equal(got, expected)
    assert info.shape == indices.shape


@settings(max_examples=25, deadline=None)
@given(st.lists(st.integers(1, 4), min_size=1, max_size=4), st.data())
def test_gather_nd_with_batch_dims_matches_reference(dims, data):
    batch_dims = data.draw(st.integers(0, len(dims) - 1))
    k = data.draw(st.integers(1, len(dims) - batch_dims))
    middle = data.draw(st.lists(st.integers(1, 3), max_size=2))
    rng = np.random.default_rng(3)
    index_shape = dims[:batch_dims] + middle + [k]
    bounds = np.array(dims[batch_dims : batch_dims + k])
    indices = rng.integers(-bounds, bounds, size=index_shape).astype(np.int64)
    x = np.arange(np.prod(dims), dtype=np.float32).reshape(dims)
    assert_matches_reference("GatherND", [x, indices], {"batch_dims": batch_dims})


def test_slice_infers_from_constants_and_keeps_whole_symbolic_axes():
    data = TensorInfo(("N", 10, None))
    consts = [None, _ints([0, 2]), _ints([INT_MAX, -2]), _ints([0, 1]), None]
    infos = [data, *(TensorInfo((2,), DataType.INT64) for _ in range(3)), None]
    assert _infer("Slice", infos, consts).shape == ("N", 6, None)
    unknown_starts = [None, None, _ints([INT_MAX]), _ints([1]), None]
    assert _infer("Slice", infos, unknown_starts).shape == ("N", None, None)
    assert _infer("Slice", [TensorInfo(None), *infos[1:]], consts).shape is None


def test_gather_infers_shapes_with_unknown_dims():
    (info,) = get_layer_kind("Gather").infer(
        make_descriptor("Gather", {"axis": 1}, opset=13, num_outputs=1),
        [TensorInfo(("N", 5, None)), TensorInfo((None, 2), DataType.INT64)],
        [None, None],
    )
    assert info.shape == ("N", None, 2, None)
    nd = _infer(
        "GatherND",
        [TensorInfo(("N", 4, 5)), TensorInfo(("N", 3, 1), DataType.INT64)],
        [None, None],
        batch_dims=1,
    )
    assert nd.shape == ("N", 3, 5)
    unknown = _infer(
        "GatherND", [TensorInfo(("N", 4)), TensorInfo(("N", None), DataType.INT64)], [None, None]
    )
    assert unknown.shape is None


def test_bad_slice_and_gather_inputs_raise():
    x = TensorInfo((4, 5))
    i = TensorInfo((1,), DataType.INT64)
    with pytest.raises(ShapeError, match="steps may not be 0"):
        _infer("Slice", [x, i, i, i, i], [None, _ints([0]), _ints([2]), _ints([0]), _ints([0])])
    with pytest.raises(ShapeError, match="one length"):
        _infer("Slice", [x, i, i], [None, _ints([0, 1]), _ints([2])])
    with pytest.raises(DataTypeError, match="int32 or int64 indices"):
        _infer("Gather", [x, TensorInfo((2,), DataType.FLOAT32)], [None, None])
    with pytest.raises(ShapeError, match="rank 2"):
        _infer("GatherElements", [x, TensorInfo((2,), DataType.INT64)], [None, None])
    with pytest.raises(ShapeError, match="do not fit"):
        _infer("GatherND", [x, TensorInfo((2, 3), DataType.INT64)], [None, None])


def test_slice_kernel_returns_empty_for_reversed_range():
    x = np.arange(10, dtype=np.float32)
    (got,), (info,) = run_flowrt_node("Slice", [x, _ints([5]), _ints([2])], opset=13)
    assert got.shape == (0,) and info.shape == (0,)
