"""Bad model files give ModelLoadError / UnsupportedLayerError with the path and what was wrong."""

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import flowrt
from flowrt.errors import ModelLoadError, UnsupportedLayerError
from flowrt.models import light_model


def _relu_model(op_type="Relu", opset=13):
    node = helper.make_node(op_type, ["x"], ["y"], name="the_node")
    graph = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def test_missing_file(tmp_path):
    path = tmp_path / "nope.onnx"
    with pytest.raises(ModelLoadError, match=r"nope\.onnx does not exist"):
        flowrt.onnx.load(path)


def test_empty_file(tmp_path):
    path = tmp_path / "empty.onnx"
    path.write_bytes(b"")
    with pytest.raises(ModelLoadError, match=r"empty\.onnx is empty"):
        flowrt.onnx.load(path)


def test_truncated_file(tmp_path):
    data = light_model("squeezenet").read_bytes()
    path = tmp_path / "cut.onnx"
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(ModelLoadError, match=r"cut\.onnx.*(truncated|not)"):
        flowrt.onnx.load(path)


def test_garbage_file(tmp_path):
    path = tmp_path / "garbage.onnx"
    path.write_bytes(np.random.default_rng(0).bytes(2000))
    with pytest.raises(ModelLoadError, match=r"garbage\.onnx"):
        flowrt.onnx.load(path)


def test_directory_instead_of_file(tmp_path):
    with pytest.raises(ModelLoadError, match="is not a file"):
        flowrt.onnx.load(tmp_path)


def test_checker_failure_names_the_file(tmp_path):
    model = _relu_model()
    model.graph.node[0].input[0] = "undefined_tensor"
    path = tmp_path / "bad.onnx"
    path.write_bytes(model.SerializeToString())
    with pytest.raises(ModelLoadError, match=r"bad\.onnx fails onnx's checker"):
        flowrt.onnx.load(path)


def test_cycle_is_reported_with_node_names(tmp_path):
    a = helper.make_node("Relu", ["b_out"], ["a_out"], name="A")
    b = helper.make_node("Relu", ["a_out"], ["b_out"], name="B")
    graph = helper.make_graph(
        [a, b],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("b_out", TensorProto.FLOAT, [2])],
    )
    path = tmp_path / "cycle.onnx"
    path.write_bytes(helper.make_model(graph).SerializeToString())
    with pytest.raises(ModelLoadError, match=r"cycle\.onnx.*cycle through nodes.*(A|B)"):
        flowrt.onnx.load(path)


def test_unknown_op_names_type_node_and_opset():
    model = _relu_model("Relu", opset=13)
    model.graph.node[0].op_type = "MadeUpOp"
    with pytest.raises(UnsupportedLayerError, match=r"op MadeUpOp \(node 'the_node', opset 13\)"):
        flowrt.onnx.load(model, check=False)


def test_unknown_domain_is_unsupported():
    model = _relu_model()
    model.graph.node[0].domain = "com.example"
    model.opset_import.append(helper.make_opsetid("com.example", 1))
    with pytest.raises(UnsupportedLayerError, match=r"com\.example\.Relu"):
        flowrt.onnx.load(model, check=False)


def test_contrib_ops_flowrt_does_not_run_are_refused_by_name():
    model = _relu_model("Attention")
    model.graph.node[0].domain = "com.microsoft"
    model.opset_import.append(helper.make_opsetid("com.microsoft", 1))
    with pytest.raises(UnsupportedLayerError, match=r"com\.microsoft\.Attention .* it runs .*QLinearAdd"):
        flowrt.onnx.load(model, check=False)


def test_unknown_attribute_is_refused_not_ignored():
    model = _relu_model()
    model.graph.node[0].attribute.append(helper.make_attribute("frobnicate", 3))
    with pytest.raises(UnsupportedLayerError, match="frobnicate"):
        flowrt.onnx.load(model, check=False)


def test_initializer_listed_as_input_is_a_constant():
    model = _relu_model()
    model.graph.initializer.append(helper.make_tensor("x", TensorProto.FLOAT, [2, 3], [-1, 2, -3, 4, -5, 6]))
    net = flowrt.onnx.load(model)
    assert net.inputs == {}
    (y,) = flowrt.InferenceSession(net, backends=["CpuRef"]).run(None, {})
    np.testing.assert_array_equal(y, [[0, 2, 0], [4, 0, 6]])


def test_external_data_is_loaded(tmp_path):
    model = _relu_model("Add")
    model.graph.node[0].input.append("w")
    weights = np.arange(6, dtype=np.float32).reshape(2, 3)
    model.graph.initializer.append(onnx.numpy_helper.from_array(weights, "w"))
    onnx.save_model(
        model,
        tmp_path / "ext.onnx",
        save_as_external_data=True,
        all_tensors_to_one_file=True,
        location="ext.data",
        size_threshold=0,
    )
    assert (tmp_path / "ext.data").exists()
    sess = flowrt.InferenceSession(tmp_path / "ext.onnx", backends=["CpuRef"])
    (y,) = sess.run(None, {"x": np.ones((2, 3), np.float32)})
    np.testing.assert_array_equal(y, weights + 1)


def test_missing_external_data_file(tmp_path):
    model = _relu_model("Add")
    model.graph.node[0].input.append("w")
    model.graph.initializer.append(onnx.numpy_helper.from_array(np.ones((2, 3), np.float32), "w"))
    onnx.save_model(
        model, tmp_path / "ext.onnx", save_as_external_data=True, location="ext.data", size_threshold=0
    )
    (tmp_path / "ext.data").unlink()
    with pytest.raises(ModelLoadError, match="external data"):
        flowrt.onnx.load(tmp_path / "ext.onnx")
