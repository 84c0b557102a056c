"""CpuRef RNN, GRU and LSTM against onnx's reference evaluator and onnxruntime, their shape
inference, and what the ONNX front end makes of their attributes."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from oracle import assert_matches_reference, run_flowrt_node
from recurrentcases import layer_cases, layer_inputs, node_model, run_onnxruntime

import flowrt
from flowrt.engine.graph.layer_kind import get_layer_kind
from flowrt.engine.graph.layers.recurrent import CellActivation, cell_activations
from flowrt.errors import DataTypeError, ModelLoadError, ShapeError, UnsupportedLayerError
from flowrt.types import DataType, TensorInfo
from flowrt.workers.cpu.ref.kernels import load_all


def _run(op, inputs, attributes, num_outputs):
    got, _ = run_flowrt_node(op, inputs, attributes, num_outputs=num_outputs, opset=22)
    return got


@settings(max_examples=25, deadline=None)
@given(
    st.sampled_from(["RNN", "GRU", "LSTM"]),
    st.sampled_from(["forward", "reverse", "bidirectional"]),
    st.sampled_from([0, 1]),
    st.tuples(*[st.booleans()] * 5),
    st.booleans(),
    st.integers(0, 1000),
)
def test_default_cells_match_onnx_reference(op, direction, layout, optional, linear_before_reset, seed):
    # onnx's reference knows no sequence_lens, activations, clip nor input_forget: onnxruntime
    # checks those (below)
    inputs = layer_inputs(op, 4, 3, 5, 4, direction=direction, layout=layout, optional=optional, seed=seed)
    attributes = {"direction": direction, "layout": layout, "hidden_size": 4}
    if op == "GRU":
        attributes["linear_before_reset"] = int(linear_before_reset)
    count = 3 if op == "LSTM" else 2
    assert_matches_reference(op, inputs, attributes, opset=21, num_outputs=count, rtol=1e-5, atol=1e-6)


@settings(max_examples=25, deadline=None)
@given(layer_cases(layouts=(0,)))
def test_every_attribute_matches_onnxruntime(case):
    # onnxruntime runs layout 0 only, and needs hidden_size; flowrt may take it from R
    op, inputs, attributes, num_outputs = case
    with_size = {**attributes, "hidden_size": inputs[2].shape[2]}
    expected = run_onnxruntime(*node_model(op, inputs, with_size, num_outputs))
    got = _run(op, inputs, attributes, num_outputs)
    for g, e in zip(got, expected, strict=True):
        assert g.dtype == np.float32 and g.shape == e.shape
        np.testing.assert_allclose(g, e, rtol=1e-5, atol=1e-6)


def _as_layout_0(op, inputs):
    moved = list(inputs)
    moved[0] = np.swapaxes(inputs[0], 0, 1)
    for i in (5, 6):  # initial_h, initial_c
        if i < len(inputs) and inputs[i] is not None:
            moved[i] = np.swapaxes(inputs[i], 0, 1)
    return moved


@settings(max_examples=15, deadline=None)
@given(layer_cases(layouts=(1,), max_outputs=True))
def test_layout_1_is_layout_0_with_the_batch_first(case):
    op, inputs, attributes, num_outputs = case
    got = _run(op, inputs, attributes, num_outputs)
    y, *states = _run(op, _as_layout_0(op, inputs), {**attributes, "layout": 0}, num_outputs)
    np.testing.assert_allclose(got[0], np.transpose(y, (2, 0, 1, 3)), rtol=1e-6, atol=1e-7)
    for g, e in zip(got[1:], states, strict=True):
        np.testing.assert_allclose(g, np.swapaxes(e, 0, 1), rtol=1e-6, atol=1e-7)


def test_an_entry_stops_at_its_length_and_one_of_length_0_gives_zeros():
    inputs = layer_inputs("LSTM", 4, 3, 2, 3, direction="bidirectional", lengths=[4, 2, 0], seed=1)
    y, y_h, y_c = _run("LSTM", inputs, {"direction": "bidirectional"}, 3)
    assert not y[2:, :, 1].any() and not y[:, :, 2].any()
    assert not y_h[:, 2].any() and not y_c[:, 2].any()
    # forward: the state after its last step; reverse: after its first
    np.testing.assert_array_equal(y_h[0, 1], y[1, 0, 1])
    np.testing.assert_array_equal(y_h[1, 1], y[0, 1, 1])
    short = [inputs[0][:2, 1:2], *inputs[1:4], None, inputs[5][:, 1:2], inputs[6][:, 1:2], inputs[7]]
    alone, _, _ = _run("LSTM", short, {"direction": "bidirectional"}, 3)
    np.testing.assert_allclose(y[:2, :, 1:2], alone, rtol=1e-6)


def test_sequence_lens_outside_the_sequence_raises():
    inputs = layer_inputs("RNN", 3, 2, 2, 2, lengths=[1, 4])
    with pytest.raises(ShapeError, match=r"sequence_lens of 2 values in \[0, 3\] expected, got \[1, 4\]"):
        _run("RNN", inputs, {}, 2)


def test_float64_layers_stay_float64():
    inputs = [None if a is None else a.astype(np.float64) for a in layer_inputs("GRU", 3, 2, 2, 3)]
    y, y_h = load_all()["GRU"](flowrt.descriptors.GRU(), *inputs)
    assert y.dtype == y_h.dtype == np.float64


def test_activation_alpha_and_beta_go_to_the_activations_that_take_them_in_order():
    desc = flowrt.descriptors.LSTM(
        activations=("relu", "LeakyRelu", "HardSigmoid", "Sigmoid", "ScaledTanh", "Tanh"),
        activation_alpha=(0.3, 0.7, 2.0),
        activation_beta=(0.4,),
        direction="bidirectional",
    )
    forward, backward = cell_activations(desc)
    assert forward == (
        CellActivation("Relu"),
        CellActivation("LeakyRelu", 0.3),
        CellActivation("HardSigmoid", 0.7, 0.4),
    )
    # the lists ran out: ScaledTanh takes the alpha left and its default beta
    assert backward == (
        CellActivation("Sigmoid"),
        CellActivation("ScaledTanh", 2.0, 1.0),
        CellActivation("Tanh"),
    )
    assert cell_activations(flowrt.descriptors.GRU(activations=("Elu", "Tanh"))) == (
        (CellActivation("Elu", 1.0), CellActivation("Tanh")),
    )
    # one direction's worth serves both
    both = cell_activations(flowrt.descriptors.RNN(direction="bidirectional", activations=("Relu",)))
    assert both == ((CellActivation("Relu"),), (CellActivation("Relu"),))


@pytest.mark.parametrize(
    ("attributes", "error", "message"),
    [
        ({"activations": ("Gelu",)}, UnsupportedLayerError, "activation 'Gelu' is not supported"),
        ({"activations": ("Tanh", "Tanh")}, ValueError, "expects 1 activations"),
        ({"direction": "sideways"}, ValueError, "direction"),
        ({"layout": 2}, ValueError, "'layout' expects 0 or 1"),
        ({"clip": 0.0}, ValueError, "'clip' expects a value > 0"),
        ({"num_outputs": 3}, ValueError, "RNN has at most 2 outputs"),
    ],
)
def test_bad_attributes_fail_where_the_descriptor_is_made(attributes, error, message):
    with pytest.raises(error, match=message):
        flowrt.descriptors.RNN(**attributes)


def test_front_end_refuses_an_unknown_activation_and_reads_the_rest():
    inputs = layer_inputs("RNN", 2, 1, 2, 2)
    model, _ = node_model("RNN", inputs, {"activations": ["Swish"]}, 2)
    with pytest.raises(UnsupportedLayerError, match="RNN: activation 'Swish' is not supported"):
        flowrt.onnx.load(model)
    model, _ = node_model("RNN", inputs, {"activations": ["Tanh", "Relu"]}, 2)
    with pytest.raises(ModelLoadError, match="invalid attributes for RNN: RNN .direction forward. expects 1"):
        flowrt.onnx.load(model)
    model, _ = node_model("GRU", layer_inputs("GRU", 2, 1, 2, 2), {"linear_before_reset": 1, "clip": 2.5}, 2)
    (layer,) = [layer for layer in flowrt.onnx.load(model).graph if layer.kind == "GRU"]
    assert (layer.descriptor.linear_before_reset, layer.descriptor.clip) == (1, 2.5)


def test_infer_gives_each_layouts_shapes_and_only_the_outputs_asked_for():
    infer = get_layer_kind("LSTM").infer
    x, w, r = TensorInfo((7, "N", 5)), TensorInfo((2, 12, 5)), TensorInfo((2, 12, 3))
    desc = flowrt.descriptors.LSTM(direction="bidirectional")
    assert [i.shape for i in infer(desc, [x, w, r], [None] * 3)] == [(7, 2, "N", 3), (2, "N", 3), (2, "N", 3)]
    desc = flowrt.descriptors.LSTM(direction="bidirectional", layout=1, num_outputs=2)
    x = TensorInfo(("N", 7, 5))
    assert [i.shape for i in infer(desc, [x, w, r], [None] * 3)] == [("N", 7, 2, 3), ("N", 2, 3)]
    # X of unknown rank: Y's shape is unknown but for hidden_size, from R
    gru = flowrt.descriptors.GRU(num_outputs=1)
    (y,) = get_layer_kind("GRU").infer(
        gru, [TensorInfo(None), TensorInfo((1, 9, 4)), TensorInfo((1, 9, 3))], [None] * 3
    )
    assert y.shape == (None, 1, None, 3)


@pytest.mark.parametrize(
    ("inputs", "attributes", "error", "message"),
    [
        (
            [(4, 2, 5), (1, 8, 6), (1, 8, 2)],
            {},
            ShapeError,
            r"W of shape \(1, 8, 5\) expected, got \(1, 8, 6\)",
        ),
        (
            [(4, 2, 5), (1, 8, 5), (1, 8, 2)],
            {"hidden_size": 3},
            ShapeError,
            "hidden_size 3, W .* and R .* disagree",
        ),
        ([(4, 2, 5), (2, 8, 5), (2, 8, 2)], {}, ShapeError, r"W of shape \(1, 8, 5\) expected"),
        ([(4, 2, 5), (1, 8, 5), (1, 8, 2), (1, 10)], {}, ShapeError, r"B of shape \(1, 16\) expected"),
        ([(4, 2, 5), (1, 8, 5), (1, 8, 2), None, (3,)], {}, ShapeError, r"sequence_lens of shape \(2,\)"),
        (
            [(4, 2, 5), (1, 8, 5), (1, 8, 2), None, None, (2, 1, 2)],
            {},
            ShapeError,
            r"initial_h of shape \(1, 2, 2\)",
        ),
        (
            [(4, 2, 5), (1, 8, 5), (1, 8, 2), None, None, None, None, (1, 9)],
            {},
            ShapeError,
            r"P of shape \(1, 6\)",
        ),
    ],
)
def test_infer_names_the_input_whose_shape_is_wrong(inputs, attributes, error, message):
    infos = [
        None if s is None else TensorInfo(s, DataType.INT32 if i == 4 else DataType.FLOAT32)
        for i, s in enumerate(inputs)
    ]
    with pytest.raises(error, match=message):
        get_layer_kind("LSTM").infer(flowrt.descriptors.LSTM(**attributes), infos, [None] * len(infos))


def test_infer_checks_the_data_types():
    infer = get_layer_kind("RNN").infer
    x, r = TensorInfo((2, 1, 3)), TensorInfo((1, 4, 4))
    with pytest.raises(DataTypeError, match="RNN input W .X's type. expects one of float32, got float64"):
        infer(flowrt.descriptors.RNN(), [x, TensorInfo((1, 4, 3), DataType.FLOAT64), r], [None] * 3)
    with pytest.raises(DataTypeError, match="sequence_lens expects one of int32, int64, got float32"):
        infer(flowrt.descriptors.RNN(), [x, TensorInfo((1, 4, 3)), r, None, TensorInfo((1,))], [None] * 5)


def test_model_with_unnamed_outputs_runs_on_cpuref_as_onnxruntime_does():
    inputs = layer_inputs("LSTM", 5, 2, 3, 4, direction="reverse", lengths=[5, 3], seed=3)
    model, feeds = node_model(
        "LSTM",
        inputs,
        {"direction": "reverse", "hidden_size": 4},
        3,
        constants=(1, 2, 3),
        output_names=["", "Y_h"],
    )
    (got,) = flowrt.InferenceSession(model, backends=["CpuRef"]).run(None, feeds)
    (expected,) = run_onnxruntime(model, feeds)
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)


def test_opset_1_output_sequence_is_accepted_and_changes_nothing():
    inputs = layer_inputs("RNN", 3, 1, 2, 2)
    (a,) = _run("RNN", inputs, {"output_sequence": 1}, 1)
    (b,) = _run("RNN", inputs, {}, 1)
    np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("op", ["RNN", "GRU", "LSTM"])
def test_default_alphas_and_betas_match_onnxruntime(op):
    # (ONNX's operators' defaults; for Affine, ScaledTanh and ThresholdedRelu onnxruntime's
    # are 0, not the spec's)
    inputs = layer_inputs(op, 4, 2, 3, 4, direction="bidirectional", seed=7)
    count = {"RNN": 1, "GRU": 2, "LSTM": 3}[op]
    activations = (["LeakyRelu", "HardSigmoid", "Elu"] * 2)[: 2 * count]
    attributes = {"direction": "bidirectional", "hidden_size": 4, "activations": activations}
    expected = run_onnxruntime(*node_model(op, inputs, attributes, 2))
    for g, e in zip(_run(op, inputs, attributes, 2), expected, strict=True):
        np.testing.assert_allclose(g, e, rtol=1e-5, atol=1e-6)
