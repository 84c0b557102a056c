"""Small ONNX models for the command-line tests: quick to optimize and to load on CpuRef."""

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper


def _save(path, nodes, initializers=()) -> str:
    graph = helper.make_graph(
        nodes,
        "tiny",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])],
        list(initializers),
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)]), path)
    return str(path)


@pytest.fixture
def tiny_model(tmp_path) -> str:
    """x (1, 4) -> Relu -> y."""
    return _save(tmp_path / "tiny.onnx", [helper.make_node("Relu", ["x"], ["y"], name="relu")])


@pytest.fixture
def fallback_model(tmp_path) -> str:
    """x (1, 4) -> Relu -> CumSum -> y: CpuAcc has no CumSum, so it falls back to CpuRef."""
    axis = numpy_helper.from_array(np.array(1, np.int64), "axis")
    nodes = [
        helper.make_node("Relu", ["x"], ["r"], name="relu"),
        helper.make_node("CumSum", ["r", "axis"], ["y"], name="cumsum"),
    ]
    return _save(tmp_path / "fallback.onnx", nodes, [axis])


@pytest.fixture
def tiny_flowrt(tiny_model, tmp_path) -> str:
    """The tiny model converted for CpuRef, as a .flowrt file."""
    import flowrt

    path = tmp_path / "tiny.flowrt"
    flowrt.save(flowrt.optimize(flowrt.onnx.load(tiny_model), backends=["CpuRef"]), path)
    return str(path)
