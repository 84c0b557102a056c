"""CpuRef CausalConvWithState against onnx's reference, its shape inference and errors, and a
decode loop through the public API that carries the state from call to call."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper
from oracle import assert_matches_reference

import flowrt
from flowrt.engine.graph.layer_kind import get_layer_kind
from flowrt.engine.graph.layers.causal_conv import CausalConvWithStateDescriptor
from flowrt.errors import DataTypeError, ModelLoadError, ShapeError
from flowrt.frontends.onnx.descriptors import make_descriptor
from flowrt.types import DataType, TensorInfo
from flowrt.workers.cpu.ref.kernels import load_all

OPSET = 27


def _case(rng, batch, channels, length, k, with_bias, with_state, dtype=np.float32):
    """Inputs of one call, None for an absent optional one."""
    return [
        rng.standard_normal((batch, channels, length)).astype(dtype),
        rng.standard_normal((channels, 1, k)).astype(dtype),
        rng.standard_normal(channels).astype(dtype) if with_bias else None,
        rng.standard_normal((batch, channels, k - 1)).astype(dtype) if with_state else None,
    ]


@settings(max_examples=25, deadline=None)
@given(
    seed=st.integers(0, 2**31 - 1),
    dims=st.tuples(st.integers(1, 2), st.integers(1, 3), st.integers(1, 6), st.integers(1, 5)),
    with_bias=st.booleans(),
    with_state=st.booleans(),
    activation=st.sampled_from(["none", "silu", "swish"]),
)
def test_causal_conv_with_state_matches_reference(seed, dims, with_bias, with_state, activation):
    inputs = _case(np.random.default_rng(seed), *dims, with_bias, with_state)
    _, present = assert_matches_reference(
        "CausalConvWithState", inputs, {"activation": activation}, opset=OPSET, num_outputs=2
    )
    past = inputs[3] if with_state else np.zeros(present.shape, np.float32)
    np.testing.assert_array_equal(present, np.concatenate([past, inputs[0]], axis=2)[:, :, dims[2] :])


def test_causal_conv_with_state_in_float16_stays_float16():
    inputs = _case(np.random.default_rng(1), 2, 3, 5, 4, True, True, np.float16)
    output, present = assert_matches_reference(
        "CausalConvWithState",
        inputs,
        {"activation": "silu"},
        opset=OPSET,
        num_outputs=2,
        rtol=2e-3,
        atol=2e-3,
    )
    assert output.dtype == present.dtype == np.float16


def _infer(infos, activation="none"):
    return get_layer_kind("CausalConvWithState").infer(
        CausalConvWithStateDescriptor(activation), infos, [None] * len(infos)
    )


def test_causal_conv_with_state_infers_the_state_shape_with_symbolic_dims():
    x = TensorInfo(("B", 8, "L"), DataType.FLOAT16)
    output, present = _infer([x, TensorInfo((8, 1, 4), DataType.FLOAT16), None, None])
    assert output == x
    assert present == TensorInfo(("B", 8, 3), DataType.FLOAT16)


X = TensorInfo((2, 4, 6))
W = TensorInfo((4, 1, 3))


@pytest.mark.parametrize(
    "infos, error, message",
    [
        ([TensorInfo((2, 4)), W], ShapeError, r"input \[batch, channels, length\] expected, got \(2, 4\)"),
        ([X, TensorInfo((4, 3))], ShapeError, r"weight \[channels, 1, k\] of shape \(4, 1, \?\) expected, got \(4, 3\)"),
        ([X, TensorInfo((5, 1, 3))], ShapeError, r"of shape \(4, 1, \?\) expected, got \(5, 1, 3\)"),
        ([X, TensorInfo((4, 1, 0))], ShapeError, "a kernel of at least 1 tap expected"),
        ([X, W, TensorInfo((3,))], ShapeError, r"bias \[channels\] of shape \(4,\) expected, got \(3,\)"),
        ([X, W, None, TensorInfo((2, 4, 3))], ShapeError, r"past_state .* of shape \(2, 4, 2\) expected, got \(2, 4, 3\)"),
        ([X, TensorInfo((4, 1, 3), DataType.FLOAT16)], DataTypeError, "weight of the input's type float32 expected, got float16"),
        ([TensorInfo((2, 4, 6), DataType.FLOAT64), W], DataTypeError, "expects one of bfloat16, float16, float32, got float64"),
    ],
)  # fmt: skip
def test_causal_conv_with_state_bad_inputs_say_what_is_wrong(infos, error, message):
    with pytest.raises(error, match=message):
        _infer(infos)


def test_causal_conv_with_state_unknown_activation_fails_at_load():
    with pytest.raises(ModelLoadError, match="activation"):
        make_descriptor("CausalConvWithState", {"activation": "gelu"}, opset=OPSET, num_outputs=2)


def test_causal_conv_with_state_kernel_refuses_a_state_of_the_wrong_length():
    x, w, _, _ = _case(np.random.default_rng(0), 1, 2, 3, 4, False, False)
    with pytest.raises(ShapeError, match=r"past_state of shape \(1, 2, 3\) .* expected, got \(1, 2, 1\)"):
        load_all()["CausalConvWithState"](
            CausalConvWithStateDescriptor(), x, w, None, np.zeros((1, 2, 1), x.dtype)
        )


def test_causal_conv_with_state_decoded_token_by_token_equals_one_call_over_the_sequence():
    channels, k, length = 3, 4, 6
    rng = np.random.default_rng(27)
    x, weight, bias, _ = _case(rng, 2, channels, length, k, True, False)
    node = helper.make_node(
        "CausalConvWithState", ["x", "w", "b", "past"], ["y", "present"], activation="silu"
    )
    graph = helper.make_graph(
        [node],
        "causal_conv",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, ("B", channels, "L")),
            helper.make_tensor_value_info("past", TensorProto.FLOAT, ("B", channels, k - 1)),
        ],
        [
            helper.make_tensor_value_info("y", TensorProto.FLOAT, ("B", channels, "L")),
            helper.make_tensor_value_info("present", TensorProto.FLOAT, ("B", channels, k - 1)),
        ],
        [helper.make_tensor("w", TensorProto.FLOAT, weight.shape, weight.ravel()),
         helper.make_tensor("b", TensorProto.FLOAT, bias.shape, bias)],
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    model.ir_version = 10
    session = flowrt.InferenceSession(model, backends=["CpuRef"])
    state = np.zeros((2, channels, k - 1), np.float32)
    whole, whole_state = session.run(None, {"x": x, "past": state})
    steps = []
    for t in range(length):
        y, state = session.run(None, {"x": x[:, :, t : t + 1], "past": state})
        steps.append(y)
    np.testing.assert_allclose(np.concatenate(steps, axis=2), whole, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(state, whole_state)
    np.testing.assert_array_equal(whole_state, x[:, :, -(k - 1) :])
