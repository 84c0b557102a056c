"""InferenceSession's model argument: a wrong type gets an ArgumentError (also a TypeError)
naming it; bytes that are not a model get a ModelLoadError."""

import onnx
import pytest

import flowrt
from flowrt.errors import ArgumentError, ModelLoadError


@pytest.mark.parametrize(
    "model, found",
    [(None, "got None"), (3, "got 3"), (2.5, "got 2.5"), (["model.onnx"], r"got \['model.onnx'\] \(list\)")],
    ids=["None", "int", "float", "list"],
)
def test_a_model_of_the_wrong_type_gets_an_argument_error_naming_it(model, found):
    with pytest.raises(
        ArgumentError, match=r"^InferenceSession: path_or_bytes must be a path .*, " + found + "$"
    ):
        flowrt.InferenceSession(model)
    with pytest.raises(TypeError):  # as ONNX Runtime's InferenceSession raises
        flowrt.InferenceSession(model)


def test_bytes_that_are_not_a_model_get_a_model_load_error():
    with pytest.raises(ModelLoadError, match="model file <bytes> is not a valid ONNX protobuf"):
        flowrt.InferenceSession(b"\xff\x00 not a model")


def test_a_bytearray_holding_a_model_loads_as_bytes_do():
    model = onnx.helper.make_model(
        onnx.helper.make_graph(
            [onnx.helper.make_node("Relu", ["x"], ["y"])],
            "g",
            [onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 4])],
            [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1, 4])],
        ),
        opset_imports=[onnx.helper.make_opsetid("", 13)],
    )
    with flowrt.InferenceSession(bytearray(model.SerializeToString()), backends=["CpuRef"]) as session:
        assert [i.name for i in session.get_inputs()] == ["x"]
