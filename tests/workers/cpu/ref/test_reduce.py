"""CpuRef Reduce* and ArgMax / ArgMin against onnx's reference, and their shape inference."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from oracle import assert_matches_reference, run_flowrt_node

from flowrt.engine.graph.layer_kind import get_layer_kind
from flowrt.errors import DataTypeError, ShapeError
from flowrt.frontends.onnx.descriptors import make_descriptor
from flowrt.types import DataType, TensorInfo

REDUCE_OPS = [
    "ReduceSum", "ReduceMean", "ReduceProd", "ReduceMax", "ReduceMin",
    "ReduceL1", "ReduceL2", "ReduceSumSquare", "ReduceLogSum", "ReduceLogSumExp",
]  # fmt: skip
# The opset from which each op takes its axes as an input rather than an attribute.
AXES_INPUT_OPSET = {op: 13 if op == "ReduceSum" else 18 for op in REDUCE_OPS}


def _infer(op, inputs, consts, opset=21, **attributes):
    desc = make_descriptor(op, attributes, opset=opset, num_outputs=1)
    return get_layer_kind(op).infer(desc, inputs, consts)


def _reduce_case(op, x, axes, keepdims, new_form, noop=0):
    """Inputs and attributes for one Reduce* node, axes in the old or the new form."""
    attributes = {"keepdims": keepdims}
    if not new_form:
        if axes is not None:
            attributes["axes"] = axes
        return [x], attributes
    attributes["noop_with_empty_axes"] = noop
    return [x, None if axes is None else np.array(axes, np.int64)], attributes


def _data(op, shape, rng):
    x = rng.standard_normal(shape).astype(np.float32)
    # ReduceLogSum needs positive sums; ReduceProd stays tame with values near 1.
    if op == "ReduceLogSum":
        return np.abs(x) + 0.1
    return 0.5 + 0.5 * np.abs(x) if op == "ReduceProd" else x


@settings(max_examples=25, deadline=None)
@given(st.sampled_from(REDUCE_OPS), st.lists(st.integers(1, 4), min_size=1, max_size=4), st.data())
def test_reduce_any_axes_both_forms_matches_reference(op, shape, data):
    rank = len(shape)
    axes = data.draw(
        st.none()
        | st.lists(st.integers(-rank, rank - 1), min_size=1, max_size=rank, unique_by=lambda a: a % rank)
    )
    keepdims = data.draw(st.sampled_from([0, 1]))
    new_form = data.draw(st.booleans())
    opset = AXES_INPUT_OPSET[op] if new_form else 11
    x = _data(op, shape, np.random.default_rng(len(shape)))
    inputs, attributes = _reduce_case(op, x, axes, keepdims, new_form)
    assert_matches_reference(op, inputs, attributes, opset=opset, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("op", REDUCE_OPS)
def test_reduce_noop_with_empty_axes_skips_only_the_reduction_step(op):
    x = _data(op, (2, 3), np.random.default_rng(0))
    for axes in (None, []):
        inputs, attributes = _reduce_case(op, x, axes, 1, True, noop=1)
        (got,) = assert_matches_reference(op, inputs, attributes, opset=AXES_INPUT_OPSET[op])
        assert got.shape == x.shape


# onnx's reference warns computing the mean of an empty set (nan); flowrt gives nan quietly.
@pytest.mark.filterwarnings("ignore:Mean of empty slice", "ignore:invalid value encountered")
@pytest.mark.parametrize("op", REDUCE_OPS)
def test_reduce_over_an_empty_axis_gives_the_reduction_identity(op):
    x = np.zeros((2, 0, 3), np.float32)
    for keepdims in (0, 1):
        inputs, attributes = _reduce_case(op, x, [1], keepdims, True)
        (got,) = assert_matches_reference(op, inputs, attributes, opset=AXES_INPUT_OPSET[op])
        assert got.shape == ((2, 1, 3) if keepdims else (2, 3))


@settings(max_examples=25, deadline=None)
@given(
    st.sampled_from(["ReduceSum", "ReduceMean", "ReduceProd", "ReduceMax", "ReduceMin"]),
    st.sampled_from([np.int32, np.int64]),
    st.lists(st.integers(1, 4), min_size=1, max_size=3),
    st.integers(0, 2),
)
def test_reduce_integers_keep_their_type(op, dtype, shape, axis_seed):
    x = np.random.default_rng(axis_seed).integers(-5, 6, size=shape).astype(dtype)
    axes = [axis_seed % len(shape)]
    inputs, attributes = _reduce_case(op, x, axes, 1, True)
    (got,) = assert_matches_reference(op, inputs, attributes, opset=AXES_INPUT_OPSET[op])
    assert got.dtype == dtype


def test_reduce_max_and_min_take_bool_from_opset_20():
    x = np.array([[True, False], [False, False]])
    for op in ("ReduceMax", "ReduceMin"):
        assert_matches_reference(op, [x, np.array([1], np.int64)], {"keepdims": 0}, opset=20)


def test_reduce_log_sum_exp_is_stable_for_large_and_infinite_values():
    x = np.array([[1000.0, 1000.0], [-np.inf, -np.inf], [np.inf, 1.0]], np.float32)
    (got,), _ = run_flowrt_node("ReduceLogSumExp", [x, np.array([1], np.int64)], {"keepdims": 0}, opset=18)
    np.testing.assert_allclose(got, [1000.0 + np.log(2.0), -np.inf, np.inf], rtol=1e-6)


def test_reduce_float16_accumulates_precisely():
    x = np.full(4096, 0.1, np.float16)
    (got,), (info,) = run_flowrt_node("ReduceSum", [x], {"keepdims": 0}, opset=13)
    assert got.dtype == np.float16 and info.dtype == DataType.FLOAT16
    np.testing.assert_allclose(got, 4096 * np.float32(np.float16(0.1)), rtol=1e-3)


@settings(max_examples=25, deadline=None)
@given(st.sampled_from(["ArgMax", "ArgMin"]), st.lists(st.integers(1, 4), min_size=1, max_size=4), st.data())
def test_arg_reduce_with_ties_matches_reference(op, shape, data):
    rank = len(shape)
    attributes = {
        "axis": data.draw(st.integers(-rank, rank - 1)),
        "keepdims": data.draw(st.sampled_from([0, 1])),
        "select_last_index": data.draw(st.sampled_from([0, 1])),
    }
    # Few distinct values, so that ties are common and the tie-break rule is tested.
    x = np.random.default_rng(rank).integers(0, 3, size=shape).astype(np.float32)
    (got,) = assert_matches_reference(op, [x], attributes, opset=13)
    assert got.dtype == np.int64


def test_arg_max_picks_first_or_last_tied_index():
    x = np.array([[1, 3, 3, 0]], np.float32)
    (first,), _ = run_flowrt_node("ArgMax", [x], {"axis": 1, "keepdims": 0})
    (last,), _ = run_flowrt_node("ArgMax", [x], {"axis": 1, "keepdims": 0, "select_last_index": 1})
    assert first.tolist() == [1] and last.tolist() == [2]


def test_reduce_axis_out_of_range_or_repeated_is_a_shape_error():
    x = TensorInfo((2, 3), DataType.FLOAT32)
    with pytest.raises(ShapeError, match="out of range"):
        _infer("ReduceMean", [x], [None], opset=11, axes=[2])
    with pytest.raises(ShapeError, match="unique"):
        _infer("ReduceSum", [x, TensorInfo((2,), DataType.INT64)], [None, np.array([1, -1])])
    with pytest.raises(ShapeError, match="out of range"):
        _infer("ArgMin", [x], [None], axis=-3)


def test_arg_reduce_over_an_empty_axis_is_a_shape_error():
    with pytest.raises(ShapeError, match="empty"):
        _infer("ArgMax", [TensorInfo((2, 0), DataType.FLOAT32)], [None], axis=1)


def test_log_reductions_refuse_integers():
    x = TensorInfo((2, 3), DataType.INT32)
    with pytest.raises(DataTypeError, match="int32"):
        _infer("ReduceLogSumExp", [x], [None], opset=11)
    assert _infer("ReduceL1", [x], [None], opset=11)[0].dtype == DataType.INT32


def test_reduce_infer_keeps_unknown_dims_and_copes_with_unknown_axes():
    x = TensorInfo((None, "N", 4), DataType.FLOAT32)
    (kept,) = _infer("ReduceMax", [x], [None], opset=11, axes=[2])
    assert kept.shape == (None, "N", 1)
    (dropped,) = _infer("ReduceMax", [x], [None], opset=11, axes=[0], keepdims=0)
    assert dropped.shape == ("N", 4)
    axes = TensorInfo((1,), DataType.INT64)
    (unknown_kept,) = _infer("ReduceSum", [x, axes], [None, None])
    assert unknown_kept.shape == (None, None, None)
    (unknown_dropped,) = _infer("ReduceSum", [x, axes], [None, None], keepdims=0)
    assert unknown_dropped.shape == (None, None)
    (no_rank,) = _infer("ReduceSum", [TensorInfo(None, DataType.FLOAT32)], [None])
    assert no_rank.shape is None
    (arg,) = _infer("ArgMax", [x], [None], axis=1)
    assert arg.shape == (None, 1, 4) and arg.dtype == DataType.INT64
