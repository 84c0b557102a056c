"""CpuRef NegativeLogLikelihoodLoss and SoftmaxCrossEntropyLoss against onnxruntime (which runs
the ops' ONNX function bodies) and onnx's reference evaluator."""

import numpy as np
import onnxruntime as ort
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import helper
from oracle import run_flowrt_node, run_onnx_reference

import flowrt
from flowrt.errors import RunError, ShapeError

NLL, SCE = "NegativeLogLikelihoodLoss", "SoftmaxCrossEntropyLoss"


def loss_model(op, inputs, attributes, *, opset, num_outputs=1):
    """One loss node whose inputs are graph inputs x0, x1 (, x2) and outputs y0 (, y1)."""
    names = [f"x{i}" for i in range(len(inputs))]
    loss_shape = inputs[1].shape if attributes.get("reduction") == "none" else ()
    out_shapes = [("y0", loss_shape), ("y1", inputs[0].shape)][:num_outputs]
    dtype = helper.np_dtype_to_tensor_dtype(inputs[0].dtype)
    graph = helper.make_graph(
        [helper.make_node(op, names, [n for n, _ in out_shapes], **attributes)],
        "loss",
        [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(x.dtype), x.shape) for n, x in zip(names, inputs)],
        [helper.make_tensor_value_info(n, dtype, shape) for n, shape in out_shapes],
    )  # fmt: skip
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)]), dict(zip(names, inputs))


def run_onnxruntime(op, inputs, attributes, *, opset, num_outputs=1):
    model, feeds = loss_model(op, inputs, attributes, opset=opset, num_outputs=num_outputs)
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, feeds
    )


def assert_close(got, expected, rtol=1e-5, atol=1e-6):
    assert len(got) == len(expected)
    for g, e in zip(got, expected):
        assert g.dtype == e.dtype and g.shape == e.shape
        np.testing.assert_allclose(g, e, rtol=rtol, atol=atol)


@st.composite
def loss_cases(draw, op, reduction):
    """(inputs, attributes, opset, num_outputs) of ``op``: every attribute, optional input and output."""
    n, classes = draw(st.integers(1, 3)), draw(st.integers(1, 4))
    extra = draw(st.lists(st.integers(1, 3), max_size=3))
    dtype = draw(st.sampled_from([np.float32, np.float64]))
    rng = np.random.default_rng(draw(st.integers(0, 2**16)))
    data = rng.standard_normal((n, classes, *extra)).astype(dtype)
    if op == NLL:
        data = -np.abs(data)  # log-probabilities
    labels = rng.integers(0, classes, (n, *extra))
    attributes = {"reduction": reduction}
    ignore_index = draw(st.sampled_from([None, -1, 0, classes + 2]))
    if ignore_index is not None:
        attributes["ignore_index"] = ignore_index
        labels[rng.random(labels.shape) < 0.3] = ignore_index
    inputs = [data, labels.astype(draw(st.sampled_from([np.int32, np.int64])))]
    if draw(st.booleans()):
        inputs.append(rng.random(classes).astype(dtype))
    opset = draw(st.sampled_from([12, 13, 22] if op == NLL else [12, 13]))
    num_outputs = draw(st.sampled_from([1, 2])) if op == SCE else 1
    return inputs, attributes, opset, num_outputs


@pytest.mark.parametrize("op", [NLL, SCE])
@pytest.mark.parametrize("reduction", ["none", "sum", "mean"])
@settings(max_examples=12, deadline=None)
@given(data=st.data())
def test_losses_match_onnxruntime_and_the_reference_on_any_shape_and_attributes(op, reduction, data):
    inputs, attributes, opset, num_outputs = data.draw(loss_cases(op, reduction))
    got, infos = run_flowrt_node(op, inputs, attributes, opset=opset, num_outputs=num_outputs)
    for g, info in zip(got, infos):
        assert info.dtype.numpy == g.dtype and info.shape == g.shape
    assert_close(got, run_onnxruntime(op, inputs, attributes, opset=opset, num_outputs=num_outputs))
    # Without a weight and with ignore_index -1, onnx's reference NegativeLogLikelihoodLoss
    # (its "elif ignore_index != -1") averages over every label, ignored ones included;
    # onnxruntime, the op's function body and PyTorch divide by the counted labels only.
    reference_slip = op == NLL and attributes.get("ignore_index") == -1 and len(inputs) == 2
    if not (reference_slip and attributes["reduction"] == "mean"):
        expected = run_onnx_reference(op, inputs, attributes, opset=opset, num_outputs=num_outputs)
        assert_close(got, [np.asarray(e) for e in expected])


def test_mean_divides_by_the_counted_labels_when_ignore_index_is_minus_one():
    log_prob = np.log(np.array([[0.5, 0.25, 0.25], [0.1, 0.2, 0.7]], dtype=np.float32))
    inputs = [log_prob, np.array([1, -1])]
    (got,), _ = run_flowrt_node(NLL, inputs, {"ignore_index": -1}, opset=13)
    np.testing.assert_allclose(got, np.log(4), rtol=1e-6)
    assert_close([got], run_onnxruntime(NLL, inputs, {"ignore_index": -1}, opset=13))


@pytest.mark.parametrize("op", [NLL, SCE])
def test_mean_over_only_ignored_labels_is_nan_and_sum_is_zero(op):
    inputs = [np.zeros((2, 3), np.float32), np.array([4, 4]), np.ones(3, np.float32)]
    (mean,), _ = run_flowrt_node(op, inputs, {"ignore_index": 4}, opset=13)
    (total,), _ = run_flowrt_node(op, inputs, {"ignore_index": 4, "reduction": "sum"}, opset=13)
    assert np.isnan(mean) and total == 0 and mean.dtype == np.float32


def test_ignored_sample_with_infinite_log_probability_has_zero_loss():
    log_prob = np.array([[-np.inf, -1.0], [-2.0, -np.inf]], dtype=np.float32)
    attributes = {"ignore_index": 5, "reduction": "none"}
    for weight in [None, np.ones(2, np.float32)]:
        (loss,), _ = run_flowrt_node(NLL, [log_prob, np.array([5, 0]), weight], attributes)
        np.testing.assert_array_equal(loss, [0.0, 2.0])


def test_float16_losses_keep_their_type_and_match_float32_closely():
    rng = np.random.default_rng(5)
    scores = (rng.standard_normal((4, 6, 50)) * 3).astype(np.float16)
    labels = rng.integers(0, 6, (4, 50))
    weight = rng.random(6).astype(np.float16)
    (loss, log_prob), _ = run_flowrt_node(SCE, [scores, labels, weight], {"reduction": "sum"}, num_outputs=2)
    (loss32, log_prob32), _ = run_flowrt_node(
        SCE,
        [scores.astype(np.float32), labels, weight.astype(np.float32)],
        {"reduction": "sum"},
        num_outputs=2,
    )
    assert loss.dtype == log_prob.dtype == np.float16
    np.testing.assert_allclose(loss, loss32, rtol=1e-3)
    np.testing.assert_allclose(log_prob, log_prob32, rtol=2e-3, atol=2e-3)


@pytest.mark.parametrize("op", [NLL, SCE])
def test_label_outside_the_classes_raises_a_shape_error_naming_it(op):
    inputs = [np.zeros((2, 3, 2), np.float32), np.array([[0, 1], [7, 2]])]
    with pytest.raises(
        ShapeError, match=rf"{op}: labels must be in \[0, 3\) or ignore_index 5, got 7 at index \[1, 0\]"
    ):
        run_flowrt_node(op, inputs, {"ignore_index": 5}, constant_inputs=[])


def test_softmax_cross_entropy_model_runs_through_inference_session_as_onnxruntime():
    rng = np.random.default_rng(2)
    inputs = [rng.standard_normal((3, 5, 2, 2)).astype(np.float32), rng.integers(0, 5, (3, 2, 2))]
    inputs[1][0, 1, 1] = -100
    inputs.append(rng.random(5).astype(np.float32))
    attributes = {"ignore_index": -100}
    model, feeds = loss_model(SCE, inputs, attributes, opset=13, num_outputs=2)
    session = flowrt.InferenceSession(model, backends=["CpuRef"])
    assert_close(session.run(None, feeds), run_onnxruntime(SCE, inputs, attributes, opset=13, num_outputs=2))
    feeds["x1"] = np.full((3, 2, 2), 5)
    with pytest.raises(
        RunError, match=r"labels must be in \[0, 5\) or ignore_index -100, got 5 at index \[0, 0, 0\]"
    ):
        session.run(None, feeds)
