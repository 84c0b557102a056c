"""CpuRef SwiGLU against onnx's reference, its shape inference and errors, and an opset-28
model through the public API."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper
from oracle import assert_matches_reference

import flowrt
from flowrt.engine.graph.layer_kind import get_layer_kind
from flowrt.engine.graph.layers.swiglu import SwiGLUDescriptor
from flowrt.errors import DataTypeError, ShapeError
from flowrt.types import DataType, TensorInfo
from flowrt.workers.cpu.ref.kernels import load_all

OPSET = 28


@settings(max_examples=25, deadline=None)
@given(
    seed=st.integers(0, 2**31 - 1),
    shape=st.lists(st.integers(1, 4), min_size=0, max_size=3).map(tuple),
    alpha=st.sampled_from([1.0, 0.5, 1.702, -2.0]),
    dtype=st.sampled_from([np.float32, np.float64]),
)
def test_swiglu_matches_reference(seed, shape, alpha, dtype):
    rng = np.random.default_rng(seed)
    a, b = (rng.uniform(-8, 8, shape).astype(dtype) for _ in range(2))
    assert_matches_reference("SwiGLU", [a, b], {"alpha": alpha}, opset=OPSET)


def test_swiglu_in_float16_rounds_once_from_float32():
    rng = np.random.default_rng(1)
    a, b = (rng.uniform(-6, 6, (3, 8)).astype(np.float16) for _ in range(2))
    (y,) = assert_matches_reference("SwiGLU", [a, b], opset=OPSET, rtol=2e-3, atol=2e-3)
    a32, b32 = a.astype(np.float32), b.astype(np.float32)
    np.testing.assert_array_equal(y, (a32 / (1 + np.exp(-a32)) * b32).astype(np.float16))


def test_swiglu_of_very_negative_gates_is_zero_without_overflow():
    a = np.array([-1e4, -100.0, 0.0], np.float32)
    with np.errstate(over="raise", invalid="raise"):
        y = load_all()["SwiGLU"](SwiGLUDescriptor(), a, np.ones_like(a))
    np.testing.assert_allclose(y, [0, 0, 0], rtol=0, atol=1e-30)


def _infer(a, b):
    return get_layer_kind("SwiGLU").infer(SwiGLUDescriptor(), [a, b], [None, None])


def test_swiglu_infers_the_shape_the_inputs_share():
    assert _infer(TensorInfo(("B", None, 8)), TensorInfo((None, 5, 8))) == [TensorInfo(("B", 5, 8))]
    assert _infer(TensorInfo(None), TensorInfo((2, 3))) == [TensorInfo((2, 3))]


@pytest.mark.parametrize(
    "a, b, error, message",
    [
        (TensorInfo((2, 3)), TensorInfo((1, 3)), ShapeError, r"A and B of one shape expected \(nothing is broadcast\), got \(2, 3\) and \(1, 3\)"),
        (TensorInfo((2, 3)), TensorInfo((3,)), ShapeError, r"got \(2, 3\) and \(3,\)"),
        (TensorInfo((2,)), TensorInfo((2,), DataType.FLOAT16), DataTypeError, "inputs of one data type, got float32, float16"),
        (TensorInfo((2,), DataType.INT32), TensorInfo((2,), DataType.INT32), DataTypeError, "input A expects one of"),
    ],
)  # fmt: skip
def test_swiglu_bad_inputs_say_what_is_wrong(a, b, error, message):
    with pytest.raises(error, match=message):
        _infer(a, b)


def test_swiglu_model_runs_through_the_public_api():
    rng = np.random.default_rng(28)
    a, b = (rng.standard_normal((2, 16)).astype(np.float32) for _ in range(2))
    graph = helper.make_graph(
        [helper.make_node("SwiGLU", ["a", "b"], ["y"], alpha=1.702)],
        "swiglu",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, ("N", 16)) for n in ("a", "b")],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ("N", 16))],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    model.ir_version = 10
    (y,) = flowrt.InferenceSession(model, backends=["CpuRef"]).run(None, {"a": a, "b": b})
    alpha = np.float32(1.702)
    np.testing.assert_allclose(y, a / (1 + np.exp(-alpha * a)) * b, rtol=1e-5, atol=1e-6)
