"""CpuRef ScatterElements, Scatter and ScatterND against onnx's reference, and their shape
inference."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from oracle import assert_matches_reference, run_flowrt_node

from flowrt.engine.graph.layer_kind import get_layer_kind
from flowrt.engine.graph.layers.scatter import ScatterElementsDescriptor, ScatterNDDescriptor
from flowrt.errors import DataTypeError, ShapeError
from flowrt.types import DataType, TensorInfo

REDUCTIONS = ["none", "add", "mul", "max", "min"]
I64 = DataType.INT64


def _element_indices(rng, data_dims, index_dims, axis, distinct):
    """Indices along ``axis`` (some negative), distinct per line when ``distinct``."""
    n = data_dims[axis]
    if distinct:
        keys = rng.random(index_dims[:axis] + [n] + index_dims[axis + 1 :])
        picked = np.argsort(keys, axis=axis).take(range(index_dims[axis]), axis=axis)
    else:
        picked = rng.integers(0, n, index_dims)
    return np.where(rng.random(picked.shape) < 0.3, picked - n, picked).astype(np.int64)


@settings(max_examples=25, deadline=None)
@given(st.lists(st.integers(1, 4), min_size=1, max_size=3), st.sampled_from(REDUCTIONS), st.data())
def test_scatter_elements_every_reduction_matches_reference(dims, reduction, data):
    rng = np.random.default_rng(sum(dims))
    axis = data.draw(st.integers(-len(dims), len(dims) - 1))
    index_dims = [data.draw(st.integers(1, d)) for d in dims]
    indices = _element_indices(rng, dims, index_dims, axis % len(dims), distinct=reduction == "none")
    x = rng.standard_normal(dims).astype(np.float32)
    updates = rng.standard_normal(index_dims).astype(np.float32)
    attributes = {"axis": axis, "reduction": reduction}
    assert_matches_reference("ScatterElements", [x, indices, updates], attributes, opset=18)


def test_repeated_indices_combine_every_update():
    x = np.zeros(3, dtype=np.int32)
    indices = np.array([1, 1, 1, 2], dtype=np.int64)
    updates = np.array([1, 2, 3, 4], dtype=np.int32)
    (got,) = assert_matches_reference(
        "ScatterElements", [x, indices, updates], {"reduction": "add"}, opset=18
    )
    np.testing.assert_array_equal(got, [0, 6, 4])


def test_legacy_scatter_replaces_along_axis():
    x = np.zeros((2, 3), dtype=np.float32)
    indices = np.array([[2, 0]], dtype=np.int64)
    updates = np.array([[5.0, 7.0]], dtype=np.float32)
    # onnx's reference has no Scatter: the expected values are written out.
    (got,), (info,) = run_flowrt_node("Scatter", [x, indices, updates], {"axis": 1}, opset=10)
    np.testing.assert_array_equal(got, [[7.0, 0.0, 5.0], [0.0, 0.0, 0.0]])
    assert info == TensorInfo((2, 3))


@settings(max_examples=25, deadline=None)
@given(st.lists(st.integers(1, 4), min_size=1, max_size=4), st.sampled_from(REDUCTIONS), st.data())
def test_scatter_nd_every_reduction_matches_reference(dims, reduction, data):
    rng = np.random.default_rng(sum(dims))
    k = data.draw(st.integers(1, len(dims)))
    cells = int(np.prod(dims[:k]))
    count = data.draw(st.integers(1, cells))
    if reduction == "none":  # distinct index tuples: repeated ones are undefined without a reduction
        flat = rng.permutation(cells)[:count]
    else:
        flat = rng.integers(0, cells, count)
    indices = np.stack(np.unravel_index(flat, dims[:k]), axis=-1).astype(np.int64)
    x = rng.standard_normal(dims).astype(np.float32)
    updates = rng.standard_normal((count, *dims[k:])).astype(np.float32)
    assert_matches_reference("ScatterND", [x, indices, updates], {"reduction": reduction}, opset=18)


def test_infer_copes_with_unknown_dims_and_ranks():
    elements = get_layer_kind("ScatterElements").infer
    data = TensorInfo(("N", None))
    got = elements(
        ScatterElementsDescriptor(), [data, TensorInfo((None, 2), I64), TensorInfo(("M", 2))], [None] * 3
    )
    assert got[0] == data
    nd = get_layer_kind("ScatterND").infer
    args = [TensorInfo(("N", 4, 5)), TensorInfo((None, None), I64), TensorInfo(None)]
    assert nd(ScatterNDDescriptor(), args, [None] * 3)[0].shape == ("N", 4, 5)
    args = [TensorInfo(("N", 4, 5)), TensorInfo((7, 2), I64), TensorInfo((None, 5))]
    assert nd(ScatterNDDescriptor(), args, [None] * 3)[0].shape == ("N", 4, 5)


def test_mismatched_shapes_and_types_raise():
    elements = get_layer_kind("ScatterElements").infer
    with pytest.raises(ShapeError, match="one shape"):
        elements(
            ScatterElementsDescriptor(),
            [TensorInfo((3, 3)), TensorInfo((2, 2), I64), TensorInfo((2, 3))],
            [None] * 3,
        )
    with pytest.raises(ShapeError, match="rank 2"):
        elements(
            ScatterElementsDescriptor(),
            [TensorInfo((3, 3)), TensorInfo((2,), I64), TensorInfo((2,))],
            [None] * 3,
        )
    with pytest.raises(DataTypeError, match="indices"):
        elements(
            ScatterElementsDescriptor(), [TensorInfo((3,)), TensorInfo((2,)), TensorInfo((2,))], [None] * 3
        )
    nd = get_layer_kind("ScatterND").infer
    with pytest.raises(ShapeError, match=r"updates of shape \(2, 5\)"):
        nd(
            ScatterNDDescriptor(),
            [TensorInfo((3, 4, 5)), TensorInfo((2, 2), I64), TensorInfo((2, 4))],
            [None] * 3,
        )
    with pytest.raises(ShapeError, match="at most 3 values"):
        nd(
            ScatterNDDescriptor(),
            [TensorInfo((3, 4, 5)), TensorInfo((2, 4), I64), TensorInfo((2,))],
            [None] * 3,
        )
    with pytest.raises(ValueError):
        ScatterNDDescriptor(reduction="sum")
