"""CpuRef RMSNormalization against its formula and onnx's reference, its shape inference, and
an opset-23 ONNX model through the public API against onnxruntime."""

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
from flowrt.errors import ShapeError
from flowrt.types import DataType, TensorInfo
from flowrt.workers.cpu.ref.kernels import load_all


def _normal(shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


@settings(max_examples=25, deadline=None)
@given(shape=st.lists(st.integers(1, 5), min_size=1, max_size=4), data=st.data())
def test_rms_normalization_is_x_over_its_root_mean_square_times_scale(shape, data):
    axis = data.draw(st.integers(-len(shape), len(shape) - 1))
    epsilon = data.draw(st.sampled_from([1e-5, 1e-2]))
    normalized = tuple(shape[axis:])
    scale = _normal(normalized[data.draw(st.integers(0, len(normalized) - 1)) :], 1)
    x = _normal(shape)
    desc = flowrt.descriptors.RMSNormalization(axis=axis, epsilon=epsilon)
    got = load_all()["RMSNormalization"](desc, x, scale)
    x64 = x.astype(np.float64)
    axes = tuple(range(axis % len(shape), len(shape)))
    expected = x64 / np.sqrt(np.mean(x64 * x64, axis=axes, keepdims=True) + epsilon) * scale
    assert got.dtype == np.float32 and got.shape == x.shape
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("axis, scale_shape", [(-1, (4,)), (1, (3, 4)), (0, (1, 4))])
def test_rms_normalization_matches_onnx_reference(axis, scale_shape):
    x, scale = _normal((2, 3, 4)), _normal(scale_shape, 1)
    assert_matches_reference("RMSNormalization", [x, scale], {"axis": axis, "epsilon": 1e-3}, opset=23)


def _infer(x: TensorInfo, scale: TensorInfo, **attributes):
    desc = flowrt.descriptors.RMSNormalization(**attributes)
    return get_layer_kind("RMSNormalization").infer(desc, [x, scale], [None, None])


def test_rms_normalization_output_is_x_shaped_in_the_scale_type():
    (y,) = _infer(TensorInfo(("n", 3, 4)), TensorInfo((4,), DataType.FLOAT16))
    assert y == TensorInfo(("n", 3, 4), DataType.FLOAT16)


@pytest.mark.parametrize(
    "scale, attributes, message",
    [((5,), {}, "does not broadcast"), ((4,), {"axis": 3}, "axis"), ((2, 2, 3, 4), {}, "does not broadcast")],
)
def test_rms_normalization_shape_errors_say_what_is_wrong(scale, attributes, message):
    with pytest.raises(ShapeError, match=message):
        _infer(TensorInfo((2, 3, 4)), TensorInfo(scale), **attributes)


def rms_norm_model(shape=(2, 5, 16), axis=-1, epsilon=1e-6) -> tuple[onnx.ModelProto, np.ndarray]:
    """One opset-23 RMSNormalization node with a constant scale over the dims from ``axis`` on."""
    scale = np.linspace(0.5, 1.5, int(np.prod(shape[axis:])), dtype=np.float32).reshape(shape[axis:])
    node = helper.make_node("RMSNormalization", ["x", "scale"], ["y"], axis=axis, epsilon=epsilon)
    graph = helper.make_graph(
        [node],
        "rms",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)],
        [onnx.numpy_helper.from_array(scale, "scale")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 23)])
    model.ir_version = 10
    return model, scale


def test_opset_23_rms_normalization_imports_and_matches_onnxruntime():
    model, _ = rms_norm_model(axis=-2, epsilon=1e-3)
    net = flowrt.onnx.load(model)
    (layer,) = [layer for layer in net.graph if layer.kind == "RMSNormalization"]
    assert (layer.descriptor.axis, layer.descriptor.epsilon) == (-2, pytest.approx(1e-3))
    x = _normal((2, 5, 16), 3) * 4
    (got,) = flowrt.InferenceSession(model, backends=["CpuRef"]).run(None, {"x": x})
    (expected,) = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, {"x": x}
    )
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)
