"""Small ONNX models for the tests of flowrt's ONNX Runtime API (tests/test_ort_api*.py)."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper


def _model(nodes, inputs, outputs, initializers=(), **fields) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "tiny", inputs, outputs, list(initializers), doc_string="a tiny graph")
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], **fields)
    model.ir_version = 8  # what the installed onnxruntime reads
    return model


def tiny_model() -> onnx.ModelProto:
    """x[batch, 4] -> Relu -> y, and Sigmoid(x) -> z; with metadata. Activations only: their
    CpuAcc kernel is one numba function, so a cold cache compiles little."""
    model = _model(
        [
            helper.make_node("Relu", ["x"], ["y"], name="relu"),
            helper.make_node("Sigmoid", ["x"], ["z"], name="sigmoid"),
        ],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])],
        [
            helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4]),
            helper.make_tensor_value_info("z", TensorProto.FLOAT, ["batch", 4]),
        ],
        producer_name="flowrt-tests",
        domain="ai.flowrt.test",
        doc_string="a tiny model",
        model_version=3,
    )
    helper.set_model_props(model, {"author": "tests", "license": "none"})
    return model


def relu_model() -> onnx.ModelProto:
    """x[2, 3] -> Relu -> y: the smallest model a session runs."""
    return _model(
        [helper.make_node("Relu", ["x"], ["y"], name="relu")],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])],
    )


def constant_subgraph_model() -> onnx.ModelProto:
    """y = x * (a + b): a constant Add that graph passes fold away."""
    a = helper.make_tensor("a", TensorProto.FLOAT, [3], [1, 2, 3])
    b = helper.make_tensor("b", TensorProto.FLOAT, [3], [3, 2, 1])
    return _model(
        [
            helper.make_node("Add", ["a", "b"], ["c"], name="const_add"),
            helper.make_node("Mul", ["x", "c"], ["y"], name="mul"),
        ],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])],
        [a, b],
    )


# (ONNX element type, numpy dtype) of each input of typed_model.
TYPED_INPUTS = {
    "f32": (TensorProto.FLOAT, np.float32),
    "f64": (TensorProto.DOUBLE, np.float64),
    "i64": (TensorProto.INT64, np.int64),
    "i32": (TensorProto.INT32, np.int32),
    "u8": (TensorProto.UINT8, np.uint8),
    "flag": (TensorProto.BOOL, np.bool_),
    "f16": (TensorProto.FLOAT16, np.float16),
}


def typed_model() -> onnx.ModelProto:
    """One input of each type in TYPED_INPUTS, each through Identity to an output of its own."""
    return _model(
        [helper.make_node("Identity", [name], [f"{name}_out"], name=f"id_{name}") for name in TYPED_INPUTS],
        [helper.make_tensor_value_info(name, t, [2]) for name, (t, _) in TYPED_INPUTS.items()],
        [helper.make_tensor_value_info(f"{name}_out", t, [2]) for name, (t, _) in TYPED_INPUTS.items()],
    )
