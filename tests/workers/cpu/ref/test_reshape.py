"""CpuRef Reshape, Flatten, Squeeze and Unsqueeze against onnx's reference, and their shape inference."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from oracle import assert_matches_reference, run_flowrt_node

from flowrt.engine.graph.layer_kind import get_layer_kind
from flowrt.errors import ShapeError
from flowrt.frontends.onnx.descriptors import make_descriptor
from flowrt.types import DataType, TensorInfo

shapes = st.lists(st.integers(1, 4), min_size=1, max_size=4)


def _infer(op, inputs, consts, opset=21, **attributes):
    desc = make_descriptor(op, attributes, opset=opset, num_outputs=1)
    return get_layer_kind(op).infer(desc, inputs, consts)[0]


@settings(max_examples=25, deadline=None)
@given(shapes, st.randoms(use_true_random=False), st.booleans(), st.booleans())
def test_reshape_to_permuted_dims_with_copy_and_inferred_dims_matches_reference(
    dims, rng, use_minus_one, use_zero
):
    target = list(dims)
    rng.shuffle(target)
    if use_zero:
        target = [0 if t == d else t for t, d in zip(target, dims, strict=False)]
    if use_minus_one:
        target[rng.randrange(len(target))] = -1
    x = np.random.default_rng(0).standard_normal(dims).astype(np.float32)
    assert_matches_reference("Reshape", [x, np.array(target, dtype=np.int64)], opset=14)


def test_reshape_allowzero_keeps_zero_dims():
    x = np.zeros((0, 3), dtype=np.float32)
    got = assert_matches_reference(
        "Reshape", [x, np.array([3, 0], dtype=np.int64)], {"allowzero": 1}, opset=14
    )
    assert got[0].shape == (3, 0)


def test_reshape_shape_attribute_before_opset_5():
    x = np.arange(24, dtype=np.int32).reshape(2, 3, 4)
    (got,), (info,) = run_flowrt_node("Reshape", [x], {"shape": [4, -1]}, opset=1)
    np.testing.assert_array_equal(got, x.reshape(4, 6))
    assert info.shape == (4, 6)


@settings(max_examples=25, deadline=None)
@given(shapes, st.data())
def test_flatten_at_every_axis_matches_reference(dims, data):
    axis = data.draw(st.integers(-len(dims), len(dims)))
    x = np.arange(np.prod(dims), dtype=np.float32).reshape(dims)
    assert_matches_reference("Flatten", [x], {"axis": axis}, opset=13)


@settings(max_examples=25, deadline=None)
@given(st.lists(st.integers(1, 3), min_size=1, max_size=5), st.data(), st.sampled_from([11, 13]))
def test_squeeze_chosen_or_all_unit_dims_matches_reference(dims, data, opset):
    ones = [i for i, d in enumerate(dims) if d == 1]
    axes = data.draw(st.lists(st.sampled_from(ones), unique=True)) if ones else []
    axes = [a - len(dims) if data.draw(st.booleans()) else a for a in axes]
    x = np.ones(dims, dtype=np.float32)
    if not axes:
        assert_matches_reference("Squeeze", [x], opset=opset)
    elif opset == 11:
        # onnx's reference removes opset-11 axes one by one from the last: the spec when sorted.
        assert_matches_reference("Squeeze", [x], {"axes": sorted(a % len(dims) for a in axes)}, opset=opset)
    else:
        assert_matches_reference("Squeeze", [x, np.array(axes, dtype=np.int64)], opset=opset)


@settings(max_examples=25, deadline=None)
@given(shapes, st.data(), st.sampled_from([11, 13]))
def test_unsqueeze_any_axes_matches_reference(dims, data, opset):
    out_rank = len(dims) + data.draw(st.integers(1, 3))
    axes = data.draw(
        st.lists(
            st.integers(0, out_rank - 1),
            min_size=out_rank - len(dims),
            max_size=out_rank - len(dims),
            unique=True,
        )
    )
    x = np.zeros(dims, dtype=np.int64)
    if opset == 11:
        # onnx's reference inserts opset-11 axes one by one, which is the spec only when sorted.
        assert_matches_reference("Unsqueeze", [x], {"axes": sorted(axes)}, opset=opset)
        return
    axes = [a - out_rank if data.draw(st.booleans()) else a for a in axes]
    assert_matches_reference("Unsqueeze", [x, np.array(axes, dtype=np.int64)], opset=opset)


def test_unsqueeze_attribute_axes_are_output_positions_in_any_order():
    x = np.zeros((2, 3), dtype=np.float32)
    (got,), (info,) = run_flowrt_node("Unsqueeze", [x], {"axes": [-1, 0]}, opset=11)
    assert got.shape == info.shape == (1, 2, 3, 1)


def test_reshape_infers_minus_one_past_symbolic_batch():
    data = TensorInfo(("N", 3, 4, 4))
    info = _infer("Reshape", [data, TensorInfo((2,), DataType.INT64)], [None, np.array([0, -1])])
    assert info.shape == ("N", 48)


def test_reshape_with_computed_shape_gives_rank_only():
    data = TensorInfo(("N", None, 4))
    info = _infer("Reshape", [data, TensorInfo((3,), DataType.INT64)], [None, None])
    assert info.shape == (None, None, None)
    unknown = _infer("Reshape", [TensorInfo(None), TensorInfo((None,), DataType.INT64)], [None, None])
    assert unknown.shape is None


def test_shape_ops_infer_unknown_dims_as_unknown():
    assert _infer("Flatten", [TensorInfo(("N", 3, None))], [None], axis=1).shape == ("N", None)
    assert _infer("Flatten", [TensorInfo(None)], [None]).shape == (None, None)
    assert _infer("Squeeze", [TensorInfo(("N", 1, 5))], [None], opset=11).shape is None
    assert _infer("Squeeze", [TensorInfo(("N", 1, 5))], [None], opset=11, axes=[1]).shape == ("N", 5)
    ax = TensorInfo((2,), DataType.INT64)
    assert _infer("Unsqueeze", [TensorInfo(("N", 5)), ax], [None, None], opset=13).shape == (None,) * 4
    assert _infer("Unsqueeze", [TensorInfo(None), ax], [None, np.array([0, 1])], opset=13).shape is None


def test_reshape_to_wrong_element_count_raises():
    with pytest.raises(ShapeError, match="cannot reshape 24 elements"):
        _infer("Reshape", [TensorInfo((2, 3, 4)), TensorInfo((2,), DataType.INT64)], [None, np.array([5, 5])])
    with pytest.raises(ShapeError, match="at most one -1"):
        _infer(
            "Reshape", [TensorInfo((2, 3, 4)), TensorInfo((2,), DataType.INT64)], [None, np.array([-1, -1])]
        )
    with pytest.raises(ShapeError, match="do not divide"):
        _infer(
            "Reshape", [TensorInfo((2, 3, 4)), TensorInfo((2,), DataType.INT64)], [None, np.array([5, -1])]
        )


def test_squeeze_of_non_unit_dim_and_bad_axes_raise():
    with pytest.raises(ShapeError, match="must be 1"):
        _infer("Squeeze", [TensorInfo((2, 3))], [None], opset=11, axes=[0])
    with pytest.raises(ShapeError, match="axis in"):
        _infer("Flatten", [TensorInfo((2, 3))], [None], axis=3)
    with pytest.raises(ShapeError, match="unique"):
        _infer("Unsqueeze", [TensorInfo((2, 3))], [None], opset=11, axes=[0, -4])
