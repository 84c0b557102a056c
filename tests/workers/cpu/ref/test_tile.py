"""CpuRef Tile and Expand against onnx's reference, and their shape inference."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from oracle import assert_matches_reference, run_flowrt_node

from flowrt.engine.graph.layer_kind import NoDescriptor, get_layer_kind
from flowrt.errors import ShapeError
from flowrt.types import DataType, TensorInfo

dims_strategy = st.lists(st.integers(1, 4), min_size=1, max_size=4)
SHAPE = TensorInfo((None,), DataType.INT64)


def _infer(op, inputs, consts):
    return get_layer_kind(op).infer(NoDescriptor(), inputs, consts)[0]


@settings(max_examples=25, deadline=None)
@given(dims_strategy, st.data())
def test_tile_any_repeats_matches_reference(dims, data):
    repeats = data.draw(st.lists(st.integers(0, 3), min_size=len(dims), max_size=len(dims)))
    x = np.arange(np.prod(dims), dtype=np.float32).reshape(dims)
    assert_matches_reference("Tile", [x, np.array(repeats, dtype=np.int64)], opset=13)


def test_tile_with_axis_input_of_opset_1_repeats_along_that_axis():
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    (got,), (info,) = run_flowrt_node("Tile", [x, np.array(3), np.array(1)], opset=1)
    np.testing.assert_array_equal(got, np.tile(x, (1, 3)))
    assert info.shape == (2, 9)


@settings(max_examples=25, deadline=None)
@given(dims_strategy, st.data())
def test_expand_broadcasts_both_ways_matches_reference(dims, data):
    # Each target dim is 1 (keep the input's) or the input's dim when that is not 1 (else anything).
    target = [data.draw(st.sampled_from([1, d] if d != 1 else [1, 2, 3])) for d in dims]
    target = data.draw(st.lists(st.integers(1, 3), max_size=2)) + target
    cut = data.draw(st.integers(0, len(dims) - 1))
    x = np.arange(np.prod(dims), dtype=np.int32).reshape(dims)
    got = assert_matches_reference("Expand", [x, np.array(target[cut:], dtype=np.int64)])
    assert got[0].flags.writeable


def test_infer_copes_with_unknown_dims_and_shapes():
    assert _infer(
        "Tile", [TensorInfo(("N", 3)), TensorInfo((2,), DataType.INT64)], [None, np.array([1, 2])]
    ).shape == ("N", 6)
    assert _infer("Tile", [TensorInfo(("N", 3)), TensorInfo((2,), DataType.INT64)], [None, None]).shape == (
        None,
        None,
    )
    assert _infer(
        "Tile", [TensorInfo(None), TensorInfo((2,), DataType.INT64)], [None, np.array([1, 2])]
    ).shape == (None, None)
    assert _infer("Expand", [TensorInfo(("N", 1)), SHAPE], [None, np.array([1, 1, 4])]).shape == (1, "N", 4)
    assert (
        _infer("Expand", [TensorInfo(("N", 1)), TensorInfo((3,), DataType.INT64)], [None, None]).shape
        == (None,) * 3
    )
    assert _infer("Expand", [TensorInfo(("N", 1)), SHAPE], [None, None]).shape is None


def test_bad_repeats_and_shapes_raise():
    with pytest.raises(ShapeError, match="2 repeats expected"):
        _infer("Tile", [TensorInfo((2, 3)), TensorInfo((1,), DataType.INT64)], [None, np.array([2])])
    with pytest.raises(ShapeError, match="cannot be broadcast"):
        _infer("Expand", [TensorInfo((2, 3)), SHAPE], [None, np.array([4, 3])])
