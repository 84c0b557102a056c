"""ONNX Dropout: training mode is refused (never run as inference in silence); inference-mode
Dropout is the identity, removed by the optimizer."""

import numpy as np
import pytest
import trio
from onnx import TensorProto, helper, numpy_helper

import flowrt
from flowrt.errors import RunError, UnsupportedLayerError

X = np.array([[1.0, -2.0, 3.0], [4.0, 5.0, -6.0]], np.float32)


def _dropout_model(inputs, *, initializers=(), graph_inputs=(), opset=13, **attributes):
    """A model ``y = Dropout(x, ...)`` named "drop"; ``initializers``: {name: array}."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, list(X.shape))
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, list(X.shape))
    node = helper.make_node("Dropout", inputs, ["y"], name="drop", **attributes)
    graph = helper.make_graph(
        [node],
        "dropout",
        [x, *graph_inputs],
        [y],
        initializer=[numpy_helper.from_array(value, name) for name, value in dict(initializers).items()],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


TRUE, HALF = np.array(True), np.array(0.5, np.float32)


@pytest.mark.parametrize(
    "model, why",
    [
        (_dropout_model(["x", "", "mode"], initializers={"mode": TRUE}), "the ratio is not 0"),
        (
            _dropout_model(["x", "ratio", "mode"], initializers={"mode": TRUE, "ratio": HALF}),
            "the ratio is not 0",
        ),
        (
            _dropout_model(
                ["x", "ratio", "mode"],
                initializers={"mode": TRUE},
                graph_inputs=[helper.make_tensor_value_info("ratio", TensorProto.FLOAT, [])],
            ),
            "the ratio is not a constant, so it may drop",
        ),
        (_dropout_model(["x"], opset=6, is_test=0), "is_test=0 (opset 6) asks for training"),
    ],
    ids=["mode-true-default-ratio", "mode-true-ratio-half", "mode-true-ratio-an-input", "opset6-is_test-0"],
)
def test_training_mode_dropout_is_refused_when_the_model_is_loaded(model, why):
    with pytest.raises(UnsupportedLayerError) as raised:
        flowrt.optimize(flowrt.onnx.load(model), backends=["CpuRef"])
    message = str(raised.value)
    assert "layer 'drop' (Dropout)" in message
    assert "training-mode Dropout is not supported" in message and why in message


def test_a_dropout_whose_training_mode_is_an_input_refuses_true_when_it_runs():
    model = _dropout_model(
        ["x", "", "mode"], graph_inputs=[helper.make_tensor_value_info("mode", TensorProto.BOOL, [])]
    )
    opt = flowrt.optimize(flowrt.onnx.load(model), backends=["CpuRef"])
    assert "drop" in opt.assignments()  # kept, to check its mode on every run

    async def run_both():
        async with flowrt.Runtime(cpu_workers=1) as rt:
            model = await rt.load(opt)
            with trio.fail_after(10):
                outputs = await model.run({"x": X, "mode": np.array(False)})
                np.testing.assert_array_equal(outputs["y"], X)
                with pytest.raises(RunError, match="training-mode Dropout is not supported") as raised:
                    await model.run({"x": X, "mode": np.array(True)})
        assert raised.value.layer == "drop" and isinstance(raised.value.cause, UnsupportedLayerError)

    trio.run(run_both)


@pytest.mark.parametrize(
    "model",
    [
        _dropout_model(["x"]),
        _dropout_model(["x", "ratio", "mode"], initializers={"ratio": HALF, "mode": np.array(False)}),
        _dropout_model(
            ["x", "ratio", "mode"], initializers={"ratio": np.array(0.0, np.float32), "mode": TRUE}
        ),
        _dropout_model(["x"], opset=6),
        _dropout_model(["x"], opset=6, is_test=1),
        _dropout_model(["x"], opset=10, ratio=0.3),
    ],
    ids=[
        "opset13",
        "mode-false",
        "mode-true-ratio-0",
        "opset6-no-is_test",
        "opset6-is_test-1",
        "opset10-ratio",
    ],
)
def test_inference_mode_dropout_is_removed_and_passes_its_input_on(model):
    opt = flowrt.optimize(flowrt.onnx.load(model), backends=["CpuRef"])
    assert "removed Dropout 'drop'" in opt.passes
    (y,) = flowrt.InferenceSession(opt).run(None, {"x": X})
    np.testing.assert_array_equal(y, X)
