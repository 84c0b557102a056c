"""CpuRef RotaryEmbedding against onnx's reference, its shape inference and errors, and an
opset-23 model through the public API against onnxruntime."""

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper
from oracle import assert_matches_reference

import flowrt
from flowrt.engine.graph.layer_kind import get_layer_kind
from flowrt.engine.graph.layers.rotary import RotaryEmbeddingDescriptor
from flowrt.errors import DataTypeError, ModelLoadError, ShapeError
from flowrt.frontends.onnx.descriptors import make_descriptor
from flowrt.types import DataType, TensorInfo
from flowrt.workers.cpu.ref.kernels import load_all

F16, F32, I64 = DataType.FLOAT16, DataType.FLOAT32, DataType.INT64
MAX_POSITIONS = 12


def _case(rng, batch, heads, sequence, head_size, rotated, three_d, with_positions, dtype):
    """Input, caches and (maybe) position ids of one RotaryEmbedding call."""
    shape = (batch, sequence, heads * head_size) if three_d else (batch, heads, sequence, head_size)
    x = rng.standard_normal(shape).astype(dtype)
    cache_shape = (MAX_POSITIONS, rotated // 2) if with_positions else (batch, sequence, rotated // 2)
    angles = rng.uniform(0, 2 * np.pi, cache_shape)
    inputs = [x, np.cos(angles).astype(dtype), np.sin(angles).astype(dtype)]
    if with_positions:
        inputs.append(rng.integers(0, MAX_POSITIONS, (batch, sequence)).astype(np.int64))
    return inputs


@settings(max_examples=25, deadline=None)
@given(
    seed=st.integers(0, 2**31 - 1),
    dims=st.tuples(st.integers(1, 2), st.integers(1, 3), st.integers(1, 4), st.integers(1, 4)),
    partial=st.booleans(),
    three_d=st.booleans(),
    with_positions=st.booleans(),
    interleaved=st.sampled_from([0, 1]),
)
def test_rotary_embedding_matches_reference(seed, dims, partial, three_d, with_positions, interleaved):
    batch, heads, sequence, half_head = dims
    head_size = 2 * half_head
    rotated = 2 * max(1, half_head // 2) if partial else head_size
    rng = np.random.default_rng(seed)
    inputs = _case(rng, batch, heads, sequence, head_size, rotated, three_d, with_positions, np.float32)
    attributes = {"interleaved": interleaved}
    if partial:
        attributes["rotary_embedding_dim"] = rotated
    if three_d:
        attributes["num_heads"] = heads
    (y,) = assert_matches_reference("RotaryEmbedding", inputs, attributes, opset=23)
    split = (batch, sequence, heads, head_size) if three_d else y.shape  # each head's dims last
    np.testing.assert_array_equal(y.reshape(split)[..., rotated:], inputs[0].reshape(split)[..., rotated:])


def test_rotary_embedding_in_float16_stays_float16():
    inputs = _case(np.random.default_rng(1), 2, 2, 3, 8, 8, False, True, np.float16)
    (y,) = assert_matches_reference(
        "RotaryEmbedding", inputs, {"interleaved": 1}, opset=23, rtol=2e-3, atol=2e-3
    )
    assert y.dtype == np.float16


def test_rotary_embedding_of_a_4d_input_ignores_num_heads():
    inputs = _case(np.random.default_rng(2), 1, 4, 3, 4, 4, False, True, np.float32)
    assert_matches_reference("RotaryEmbedding", inputs, {"num_heads": 2}, opset=23)


def _infer(infos, **attributes):
    return get_layer_kind("RotaryEmbedding").infer(
        RotaryEmbeddingDescriptor(**attributes), infos, [None] * len(infos)
    )


def test_rotary_embedding_infers_the_input_info_with_symbolic_dims():
    x = TensorInfo(("B", 8, "S", 64), F16)
    (out,) = _infer(
        [x, TensorInfo((None, 16), F16), TensorInfo((None, 16), F16), TensorInfo(("B", "S"), I64)],
        rotary_embedding_dim=32,
    )
    assert out == x
    assert _infer([TensorInfo(None), TensorInfo((4, 2)), TensorInfo((4, 2))])[0].shape is None


X4 = TensorInfo((2, 4, 3, 8))
CACHE = TensorInfo((50, 4))
POSITIONS = TensorInfo((2, 3), I64)


@pytest.mark.parametrize(
    "infos, attributes, error, message",
    [
        ([TensorInfo((2, 3)), CACHE, CACHE], {}, ShapeError, r"a 3-D or 4-D input expected, got \(2, 3\)"),
        ([TensorInfo((2, 3, 32)), CACHE, CACHE, POSITIONS], {}, ShapeError, "needs the num_heads attribute"),
        ([TensorInfo((2, 3, 30)), CACHE, CACHE, POSITIONS], {"num_heads": 4}, ShapeError, "hidden size 30 is not a multiple of num_heads 4"),
        ([X4, CACHE, CACHE, POSITIONS], {"rotary_embedding_dim": 5}, ShapeError, "even number of rotated dims expected, got 5"),
        ([X4, CACHE, CACHE, POSITIONS], {"rotary_embedding_dim": 10}, ShapeError, "rotary_embedding_dim 10 exceeds the head size 8"),
        ([X4, TensorInfo((50, 3)), CACHE, POSITIONS], {}, ShapeError, r"cos_cache \[max_position \+ 1, .* of shape \(\?, 4\) expected, got \(50, 3\)"),
        ([X4, CACHE, CACHE], {}, ShapeError, r"cos_cache \[batch, sequence, .* of shape \(2, 3, 4\) expected, got \(50, 4\)"),
        ([X4, CACHE, CACHE, TensorInfo((2, 5), I64)], {}, ShapeError, r"position_ids .* of shape \(2, 3\) expected, got \(2, 5\)"),
        ([X4, CACHE, CACHE, TensorInfo((2, 3), DataType.INT32)], {}, DataTypeError, "position_ids expects one of int64, got int32"),
        ([X4, CACHE, TensorInfo((50, 2)), TensorInfo((2, 3), I64)], {"rotary_embedding_dim": 8}, ShapeError, r"sin_cache \[max_position \+ 1.* expected, got \(50, 2\)"),
        ([X4, TensorInfo((50, 4), F16), CACHE, POSITIONS], {}, DataTypeError, "cos_cache of the input's type float32 expected, got float16"),
        ([TensorInfo((2, 4, 3, 8), DataType.FLOAT64), CACHE, CACHE], {}, DataTypeError, "expects one of bfloat16, float16, float32, got float64"),
    ],
)  # fmt: skip
def test_rotary_embedding_bad_inputs_say_what_is_wrong(infos, attributes, error, message):
    with pytest.raises(error, match=message):
        _infer(infos, **attributes)


@pytest.mark.parametrize("attributes", [{"interleaved": 2}, {"rotary_embedding_dim": -2}, {"num_heads": -1}])
def test_rotary_embedding_bad_attributes_fail_at_load(attributes):
    with pytest.raises(ModelLoadError, match=next(iter(attributes))):
        make_descriptor("RotaryEmbedding", attributes, opset=23, num_outputs=1, where="node 'rope'")


def test_rotary_embedding_refuses_positions_past_the_cache():
    x, cache = np.zeros((1, 1, 2, 4), np.float32), np.zeros((5, 2), np.float32)
    with pytest.raises(
        ShapeError, match=r"position_ids must be in \[0, 5\) \(the cache's rows\), got values from 0 to 5"
    ):
        load_all()["RotaryEmbedding"](RotaryEmbeddingDescriptor(), x, cache, cache, np.array([[0, 5]]))


def test_rotary_embedding_model_runs_through_the_public_api_like_onnxruntime():
    rng = np.random.default_rng(23)
    x, cos, sin, positions = _case(rng, 2, 4, 5, 16, 8, True, True, np.float32)
    node = helper.make_node(
        "RotaryEmbedding",
        ["x", "cos", "sin", "positions"],
        ["y"],
        interleaved=1,
        rotary_embedding_dim=8,
        num_heads=4,
    )
    graph = helper.make_graph(
        [node],
        "rope",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, ("B", "S", 64)),
            helper.make_tensor_value_info("positions", TensorProto.INT64, ("B", "S")),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ("B", "S", 64))],
        [onnx.numpy_helper.from_array(cos, "cos"), onnx.numpy_helper.from_array(sin, "sin")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 23)])
    model.ir_version = 10
    feeds = {"x": x, "positions": positions}
    (got,) = flowrt.InferenceSession(model, backends=["CpuRef"]).run(None, feeds)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    (expected,) = session.run(None, feeds)
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(got.reshape(2, 5, 4, 16)[..., 8:], x.reshape(2, 5, 4, 16)[..., 8:])
