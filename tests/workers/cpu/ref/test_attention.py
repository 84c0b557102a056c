"""CpuRef Attention against onnx's reference, its shape inference and errors, and a model
through the public API."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper
from onnx.reference import ReferenceEvaluator
from oracle import assert_matches_reference, run_flowrt_node, run_onnx_reference

import flowrt
from flowrt.engine.graph.layer_kind import get_layer_kind
from flowrt.engine.graph.layers.attention import AttentionDescriptor
from flowrt.errors import DataTypeError, GraphError, ModelLoadError, ShapeError
from flowrt.frontends.onnx.descriptors import make_descriptor
from flowrt.types import DataType, TensorInfo

F16, F32, I64, BOOL = DataType.FLOAT16, DataType.FLOAT32, DataType.INT64, DataType.BOOL


def _mask(draw, rng, target, float_type, causal):
    """A bool or float mask broadcastable to ``target``, its last dim maybe shorter. onnx's
    reference reads the query length of a causal mask from the mask: there it is given."""
    rank = draw(st.integers(2 if causal else 1, 4))
    shape = [draw(st.sampled_from([1, d])) for d in target[4 - rank : -2]]
    if rank > 1:
        shape.append(target[2] if causal else draw(st.sampled_from([1, target[2]])))
    shape.append(draw(st.integers(1, target[-1])))
    if draw(st.booleans()):
        return rng.random(shape) < 0.7
    mask = rng.standard_normal(shape).astype(float_type)
    mask[rng.random(shape) < 0.2] = -np.inf
    return mask


@st.composite
def attention_cases(draw):
    """(inputs, attributes, opset) of one Attention call."""
    rng = np.random.default_rng(draw(st.integers(0, 2**31 - 1)))
    batch, kv_heads, group = draw(st.integers(1, 2)), draw(st.integers(1, 2)), draw(st.integers(1, 2))
    q_len, kv_len, head, v_head = (draw(st.integers(1, 4)) for _ in range(4))
    q_heads, three_d = kv_heads * group, draw(st.booleans())
    cache = draw(st.sampled_from(["none", "past", "nonpad"]))
    past = draw(st.integers(0, 2)) if cache == "past" else 0
    window = draw(st.sampled_from([(-1, -1), (1, -1), (0, 2), (2, 1)]))
    attributes = {"is_causal": draw(st.integers(0, 1)), "qk_matmul_output_mode": draw(st.integers(0, 3))}
    attributes |= {"left_window_size": window[0], "right_window_size": window[1]} if window[0] >= 0 else {}
    for name, values in (("scale", [0.3, 2.0]), ("softcap", [0.5, 3.0]), ("softmax_precision", [1, 11])):
        if draw(st.booleans()):
            attributes[name] = draw(st.sampled_from(values))
    q = rng.standard_normal((batch, q_heads, q_len, head)).astype(np.float32)
    k = rng.standard_normal((batch, kv_heads, kv_len, head)).astype(np.float32)
    v = rng.standard_normal((batch, kv_heads, kv_len, v_head)).astype(np.float32)
    if three_d:
        q, k, v = (x.transpose(0, 2, 1, 3).reshape(batch, x.shape[2], -1) for x in (q, k, v))
        attributes |= {"q_num_heads": q_heads, "kv_num_heads": kv_heads}
    target = (batch, q_heads, q_len, past + kv_len)
    mask = _mask(draw, rng, target, np.float32, attributes["is_causal"]) if draw(st.booleans()) else None
    inputs = [q, k, v, mask]
    if cache == "past":
        inputs += [rng.standard_normal((batch, kv_heads, past, d)).astype(np.float32) for d in (head, v_head)]
    if cache == "nonpad":
        inputs += [None, None, rng.integers(0, kv_len + 1, batch).astype(np.int64)]
    while inputs[-1] is None:
        inputs.pop()
    return inputs, attributes, 25 if window[0] >= 0 else 24


@settings(max_examples=25, deadline=None)
@given(case=attention_cases())
def test_attention_matches_reference(case):
    inputs, attributes, opset = case
    if attributes["qk_matmul_output_mode"] == 0 and attributes.get("softcap"):
        # onnx's reference gives the softcapped scores in mode 0; the spec (and flowrt) the raw
        # ones: see test_attention_mode_0_gives_the_scores_before_the_softcap.
        attributes["qk_matmul_output_mode"] = 1
    assert_matches_reference(
        "Attention", inputs, attributes, opset=opset, num_outputs=4, rtol=1e-5, atol=1e-6
    )


def test_attention_mode_0_gives_the_scores_before_the_softcap():
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((1, 2, 3, 4)).astype(np.float32) for _ in range(3))
    raw = run_flowrt_node("Attention", [q, k, v], {"softcap": 0.5}, opset=23, num_outputs=4)[0][3]
    np.testing.assert_allclose(raw, q @ k.transpose(0, 1, 3, 2) / 2, rtol=1e-6)
    capped = run_flowrt_node(
        "Attention", [q, k, v], {"softcap": 0.5, "qk_matmul_output_mode": 1}, opset=23, num_outputs=4
    )[0][3]
    np.testing.assert_allclose(capped, 0.5 * np.tanh(raw / 0.5), rtol=1e-6)


def test_attention_in_float16_with_a_float32_softmax_rounds_as_the_reference():
    rng = np.random.default_rng(1)
    q, k, v = (rng.standard_normal((2, 4, 3, 8)).astype(np.float16) for _ in range(3))
    mask = rng.random((3, 3)) < 0.6
    attributes = {"is_causal": 1, "softmax_precision": 1, "qk_matmul_output_mode": 3}
    got = assert_matches_reference(
        "Attention", [q, k, v, mask], attributes, opset=23, num_outputs=4, rtol=1e-3, atol=1e-3
    )
    assert got[0].dtype == got[3].dtype == np.float16


def test_attention_fully_masked_rows_give_zeros():
    q, k, v = (np.ones((1, 1, 2, 2), np.float32) for _ in range(3))
    mask = np.array([[True, True], [False, False]])
    y, _, _, probabilities = run_flowrt_node(
        "Attention", [q, k, v, mask], {"qk_matmul_output_mode": 3}, opset=23, num_outputs=4
    )[0]
    np.testing.assert_array_equal(y[0, 0, 1], 0)
    np.testing.assert_array_equal(probabilities[0, 0], [[0.5, 0.5], [0, 0]])
    assert run_onnx_reference("Attention", [q, k, v, mask], opset=23)[0][0, 0, 1].tolist() == [0, 0]


def _infer(infos, **attributes):
    return get_layer_kind("Attention").infer(AttentionDescriptor(**attributes), infos, [None] * len(infos))


def test_attention_infers_every_output_with_symbolic_dims():
    q, k, v = TensorInfo(("B", "S", 64)), TensorInfo(("B", "T", 16)), TensorInfo(("B", "T", 24))
    past_key, past_value = TensorInfo(("B", 2, "P", 8)), TensorInfo(("B", 2, "P", 12))
    y, key, value, qk = _infer(
        [q, k, v, TensorInfo(("S", None), BOOL), past_key, past_value],
        q_num_heads=8, kv_num_heads=2, num_outputs=4,
    )  # fmt: skip
    assert y == TensorInfo(("B", "S", 96))
    assert key == TensorInfo(("B", 2, None, 8)) and value == TensorInfo(("B", 2, None, 12))
    assert qk == TensorInfo(("B", 8, "S", None))
    q4 = TensorInfo((2, 4, 3, 8), F16)
    outs = _infer([q4, TensorInfo((2, 2, 5, 8), F16), TensorInfo((2, 2, 5, 6), F16)], num_outputs=4)
    assert [o.shape for o in outs] == [(2, 4, 3, 6), (2, 2, 5, 8), (2, 2, 5, 6), (2, 4, 3, 5)]
    assert _infer([TensorInfo(None, F16), q4, q4], num_outputs=2)[1] == TensorInfo(None, F16)


Q4, K4, V4 = TensorInfo((2, 4, 3, 8)), TensorInfo((2, 2, 5, 8)), TensorInfo((2, 2, 5, 6))


@pytest.mark.parametrize(
    "infos, attributes, error, message",
    [
        ([TensorInfo((2, 3)), K4, V4], {}, ShapeError, r"all 3-D or all 4-D expected, got \(2, 3\)"),
        ([TensorInfo((2, 3, 32)), TensorInfo((2, 5, 16)), TensorInfo((2, 5, 16))], {"q_num_heads": 4}, ShapeError, r"a 3-D K \(2, 5, 16\) needs the kv_num_heads attribute"),
        ([TensorInfo((2, 3, 30)), TensorInfo((2, 5, 16)), TensorInfo((2, 5, 16))], {"q_num_heads": 4, "kv_num_heads": 2}, ShapeError, "Q's hidden size 30 is not a multiple of q_num_heads 4"),
        ([Q4, TensorInfo((2, 3, 5, 8)), TensorInfo((2, 3, 5, 6))], {}, ShapeError, r"query heads \(4\) must be a multiple of the key/value heads \(3\)"),
        ([Q4, TensorInfo((2, 2, 5, 7)), V4], {}, ShapeError, "Q and K of one head size expected, got 8 and 7"),
        ([Q4, K4, TensorInfo((2, 2, 4, 6))], {}, ShapeError, "K and V of the same heads and sequence expected"),
        ([Q4, TensorInfo((1, 2, 5, 8)), V4], {}, ShapeError, "one batch size expected, got 2, 1 and 2"),
        ([Q4, K4, V4], {"q_num_heads": 4}, ShapeError, "q_num_heads and kv_num_heads are for 3-D inputs only"),
        ([Q4, K4, V4, TensorInfo((3, 6))], {}, ShapeError, r"attn_mask broadcastable to .* \(2, 4, 3, 5\) .* got \(3, 6\)"),
        ([Q4, K4, V4, TensorInfo((2, 3, 5))], {}, ShapeError, r"attn_mask broadcastable .* got \(2, 3, 5\)"),
        ([Q4, K4, V4, None, TensorInfo((2, 2, 1, 8))], {}, GraphError, "past_key and past_value come together"),
        ([Q4, K4, V4, None, TensorInfo((2, 2, 1, 8)), TensorInfo((2, 2, 1, 5))], {}, ShapeError, r"past_value \[batch, .* of shape \(2, 2, \?, 6\) expected, got \(2, 2, 1, 5\)"),
        ([Q4, K4, V4, None, None, None, TensorInfo((3,), I64)], {}, ShapeError, r"nonpad_kv_seqlen of shape \(2,\) expected, got \(3,\)"),
        ([Q4, K4, V4, None, None, None, TensorInfo((2,), I64)], {"opset": 23}, GraphError, "nonpad_kv_seqlen is an input from opset 24"),
        ([Q4, K4, V4, None, K4, V4, TensorInfo((2,), I64)], {}, GraphError, "nonpad_kv_seqlen cannot be combined with past_key"),
        ([Q4, TensorInfo((2, 2, 5, 8), F16), V4], {}, DataTypeError, "K of Q's type float32 expected, got float16"),
        ([Q4, K4, V4, TensorInfo((3, 5), DataType.INT32)], {}, DataTypeError, "attn_mask of type bool or Q's type float32 expected, got int32"),
        ([TensorInfo((2, 4, 3, 8), I64), K4, V4], {}, DataTypeError, "Q expects one of bfloat16, float16, float32, float64, got int64"),
        ([Q4, K4, V4, None, None, None, TensorInfo((2,), DataType.INT32)], {}, DataTypeError, "nonpad_kv_seqlen expects one of int64, got int32"),
        ([Q4, K4, V4], {"softmax_precision": 16}, DataTypeError, "softmax_precision bfloat16 is not supported"),
    ],
)  # fmt: skip
def test_attention_bad_inputs_say_what_is_wrong(infos, attributes, error, message):
    with pytest.raises(error, match=message):
        _infer(infos, **attributes)


@pytest.mark.parametrize(
    "attributes, opset",
    [({"is_causal": 2}, 23), ({"qk_matmul_output_mode": 4}, 23), ({"softmax_precision": 7}, 23),
     ({"q_num_heads": 0}, 23), ({"softcap": -1.0}, 23), ({"left_window_size": 2}, 24)],
)  # fmt: skip
def test_attention_bad_attributes_fail_at_load(attributes, opset):
    with pytest.raises(ModelLoadError, match="Attention"):
        make_descriptor("Attention", attributes, opset=opset, num_outputs=1, where="node 'attn'")


def test_attention_model_with_a_kv_cache_runs_through_the_public_api_like_the_reference():
    rng = np.random.default_rng(24)
    names = ("q", "k", "v", "mask", "past_key", "past_value")
    shapes = ((2, 3, 32), (2, 3, 8), (2, 3, 12), (3, 5), (2, 2, 2, 4), (2, 2, 2, 6))
    feeds = {name: rng.standard_normal(shape).astype(np.float32) for name, shape in zip(names, shapes)}
    feeds["mask"] = rng.random((3, 5)) < 0.8
    node = helper.make_node(
        "Attention",
        list(names),
        ["y", "present_key", "present_value"],
        q_num_heads=8,
        kv_num_heads=2,
        is_causal=1,
    )
    dims = (("B", "S", 32), ("B", "S", 8), ("B", "S", 12), ("S", "T"), ("B", 2, "P", 4), ("B", 2, "P", 6))
    inputs = [
        helper.make_tensor_value_info(n, TensorProto.BOOL if n == "mask" else TensorProto.FLOAT, d)
        for n, d in zip(names, dims)
    ]
    out_dims = (("B", "S", 48), ("B", 2, "T", 4), ("B", 2, "T", 6))
    outputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, d) for n, d in zip(node.output, out_dims)]
    model = helper.make_model(
        helper.make_graph([node], "gqa", inputs, outputs), opset_imports=[helper.make_opsetid("", 23)]
    )
    got = flowrt.InferenceSession(model, backends=["CpuRef"]).run(None, feeds)
    expected = ReferenceEvaluator(model).run(None, feeds)
    assert [g.shape for g in got] == [(2, 3, 48), (2, 2, 5, 4), (2, 2, 5, 6)]
    for g, e in zip(got, expected):
        np.testing.assert_allclose(g, e, rtol=1e-5, atol=1e-6)


def test_attention_causal_with_a_broadcast_mask_is_as_with_the_mask_spelled_out():
    # onnx's reference takes the query length from a causal mask's shape; the spec broadcasts.
    rng = np.random.default_rng(5)
    q, k, v = (rng.standard_normal((1, 2, 3, 4)).astype(np.float32) for _ in range(3))
    mask = rng.standard_normal((1, 3)).astype(np.float32)
    broadcast = run_flowrt_node("Attention", [q, k, v, mask], {"is_causal": 1}, opset=23)[0][0]
    spelled_out = np.broadcast_to(mask, (3, 3)).copy()
    assert_matches_reference("Attention", [q, k, v, spelled_out], {"is_causal": 1}, opset=23)
    np.testing.assert_array_equal(
        broadcast, run_flowrt_node("Attention", [q, k, v, spelled_out], {"is_causal": 1}, opset=23)[0][0]
    )
