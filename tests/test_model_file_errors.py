"""Malformed ONNX files and feeds (issue 32, item 6): each is a flowrt error that says what was
expected, what was found and where, never a UnicodeDecodeError, a bytes layer name, a bare
ValueError or MemoryError."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import flowrt
from flowrt.errors import InputError, ModelLoadError, ResourceError
from flowrt.types import TensorInfo


def _model(nodes, inputs, outputs, initializers=(), sparse=()) -> onnx.ModelProto:
    graph = helper.make_graph(
        nodes, "g", inputs, outputs, list(initializers), sparse_initializer=list(sparse)
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _relu(name: str = "the_node", op: str = "Relu") -> bytes:
    node = helper.make_node(op, ["x"], ["y"], name=name)
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])
    return _model([node], [x], [y]).SerializeToString()


def _add_initializer(init: onnx.TensorProto) -> onnx.ModelProto:
    node = helper.make_node("Add", ["x", init.name], ["y"], name="add")
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 4])
    return _model([node], [x], [y], [init])


@pytest.mark.parametrize("check", [True, False])
def test_an_op_type_that_is_not_utf8_is_a_model_load_error_naming_the_node(check):
    data = _relu(op="Reluu").replace(b"Reluu", b"Rel\xff\xfe")
    with pytest.raises(
        ModelLoadError,
        match=r"graph\.node\[0\]\.op_type \(node 0\) must be UTF-8 text, found the bytes b'Rel\\xff\\xfe'",
    ):
        flowrt.onnx.load(data, check=check)


def test_a_node_name_that_is_not_utf8_is_refused_before_any_layer_is_named(tmp_path):
    path = tmp_path / "m.onnx"
    path.write_bytes(_relu(name="nodeAA").replace(b"nodeAA", b"node\xff\xfe"))
    with pytest.raises(
        ModelLoadError, match=r"m\.onnx: graph\.node\[0\]\.name \(node 0, op Relu\) must be UTF-8"
    ):
        flowrt.onnx.load(path)


def test_a_string_attribute_that_is_not_utf8_names_the_attribute_and_node():
    node = helper.make_node("Resize", ["x", "", "scales"], ["y"], name="up", mode="linXX")
    scales = numpy_helper.from_array(np.array([1, 1, 2, 2], np.float32), "scales")
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, 2, 2])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 1, 4, 4])
    data = _model([node], [x], [y], [scales]).SerializeToString().replace(b"linXX", b"lin\xff\xfe")
    with pytest.raises(ModelLoadError, match=r"node 'up': attribute 'mode' must be UTF-8 text"):
        flowrt.onnx.load(data, check=False)


def test_an_initializer_whose_raw_data_is_too_short_names_it_and_both_sizes():
    init = numpy_helper.from_array(np.ones((4, 4), np.float32), "w")
    init.raw_data = init.raw_data[:10]
    data = _add_initializer(init).SerializeToString()
    with pytest.raises(
        ModelLoadError, match=r"initializer 'w': raw_data holds 10 bytes; its float32 shape \(4, 4\) needs 64"
    ):
        flowrt.onnx.load(data, check=False)
    with pytest.raises(ModelLoadError, match="raw_data size"):  # onnx's checker says it first
        flowrt.onnx.load(data)


def test_an_initializer_whose_typed_data_does_not_fill_its_dims_is_a_model_load_error():
    init = onnx.TensorProto(name="w", data_type=TensorProto.FLOAT, dims=[4, 4], float_data=[1.0, 2.0, 3.0])
    with pytest.raises(ModelLoadError, match=r"initializer 'w': its data does not match its dims \(4, 4\)"):
        flowrt.onnx.load(_add_initializer(init).SerializeToString(), check=False)


def test_a_sparse_initializer_of_absurd_dims_is_a_resource_error_not_a_memory_error():
    values = numpy_helper.from_array(np.ones(1, np.float32), "s")
    indices = numpy_helper.from_array(np.zeros(1, np.int64), "s_indices")
    sparse = helper.make_sparse_tensor(values, indices, [2**20, 2**20])
    node = helper.make_node("Identity", ["s"], ["y"], name="id")
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2**20, 2**20])
    data = _model([node], [], [y], sparse=[sparse]).SerializeToString()
    with pytest.raises(
        ResourceError,
        match=r"sparse initializer 's', float32 of shape \(1048576, 1048576\), needs 4,398,046,511,104 bytes, over the memory budget",
    ):
        flowrt.onnx.load(data, check=False)


def test_initializers_are_held_to_the_memory_budget_of_flowrt_onnx_load():
    init = numpy_helper.from_array(np.ones((4, 4), np.float32), "w")
    data = _add_initializer(init).SerializeToString()
    with pytest.raises(
        ResourceError,
        match=r"initializer 'w', float32 of shape \(4, 4\), needs 64 bytes, over the memory budget of 32 bytes \(set by flowrt.onnx.load\(memory_budget=...\)\)",
    ):
        flowrt.onnx.load(data, memory_budget=32)
    assert flowrt.onnx.load(data, memory_budget=64)


def test_byte_counts_of_absurd_shapes_do_not_overflow():
    assert TensorInfo((2**40, 2**40)).num_bytes == 2**82  # int64 arithmetic would wrap to 0
    assert TensorInfo((2**62, 4, 0)).num_elements == 0


async def test_ragged_nested_lists_as_a_feed_are_an_input_error_naming_the_input():
    net = flowrt.Network()
    x = net.add_input("x", TensorInfo((2, 2)))
    net.add_output("y", net.add_layer("Relu", inputs=[x]))
    async with flowrt.Runtime(cpu_workers=1) as rt:
        model = await rt.load(flowrt.optimize(net, backends=["CpuRef"]), max_in_flight=1)
        with pytest.raises(
            InputError,
            match=r"input 'x' expects an array of float32\(2, 2\), got a list that is not one array",
        ):
            await model.run({"x": [[1.0, 2.0], [3.0]]})
        feed = np.array([[1.0, -2.0], [3.0, 4.0]], np.float32)
        assert (await model.run({"x": feed}))["y"].tolist() == [[1, 0], [3, 4]]
