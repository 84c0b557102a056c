"""CpuRef Det against onnx's reference, its shape inference and errors, and through the
public API."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper
from oracle import assert_matches_reference, run_flowrt_node

import flowrt
from flowrt.engine.graph.layer_kind import NoDescriptor, get_layer_kind
from flowrt.errors import DataTypeError, ShapeError
from flowrt.types import DataType, TensorInfo


@settings(max_examples=20, deadline=None)
@given(
    seed=st.integers(0, 2**31 - 1),
    batch=st.lists(st.integers(1, 3), max_size=2),
    size=st.integers(1, 5),
    dtype=st.sampled_from([np.float32, np.float64]),
)
def test_det_matches_reference(seed, batch, size, dtype):
    x = np.random.default_rng(seed).standard_normal((*batch, size, size)).astype(dtype)
    (y,) = assert_matches_reference("Det", [x], opset=22, rtol=1e-4, atol=1e-5)
    assert y.shape == tuple(batch) and y.dtype == dtype


def test_det_in_float16_stays_float16():
    x = np.array([[[2, 1], [1, 3]], [[0, 1], [1, 0]]], np.float16)
    (y,), _ = run_flowrt_node("Det", [x], opset=22)
    np.testing.assert_array_equal(y, np.array([5, -1], np.float16))
    assert y.dtype == np.float16


@pytest.mark.parametrize(
    "info, error, message",
    [
        (TensorInfo((2, 3, 4)), ShapeError, r"square matrices \[\*, M, M\] expected, got \(2, 3, 4\)"),
        (TensorInfo((3,)), ShapeError, "square matrices"),
        (TensorInfo((3, 3), DataType.INT32), DataTypeError, "Det input expects one of float16, float32, float64, got int32"),
    ],
)  # fmt: skip
def test_det_bad_inputs_say_what_is_wrong(info, error, message):
    with pytest.raises(error, match=message):
        get_layer_kind("Det").infer(NoDescriptor(), [info], [None])


def test_det_runs_through_the_public_api():
    node = helper.make_node("Det", ["x"], ["y"])
    graph = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ("B", 3, 3))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ("B",))],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 22)])
    model.ir_version = 10
    x = np.random.default_rng(2).standard_normal((4, 3, 3)).astype(np.float32)
    (y,) = flowrt.InferenceSession(model, backends=["CpuRef"]).run(None, {"x": x})
    np.testing.assert_allclose(y, np.linalg.det(x), rtol=1e-5, atol=1e-6)
