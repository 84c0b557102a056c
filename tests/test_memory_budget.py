"""The memory budget (issue 32): constant folding, initializers and a load's memory arenas are
held to it before anything is allocated; past it is a ResourceError naming the layer, the bytes
it wanted and the budget."""

from __future__ import annotations

import os

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import flowrt
from flowrt.engine.memory.budget import default_memory_budget
from flowrt.errors import ArgumentError, ResourceError
from flowrt.types import TensorInfo


def _constant_of_shape(dims: list[int]) -> bytes:
    """The 100-byte ONNX file whose ConstantOfShape declares ``dims``."""
    shape = numpy_helper.from_array(np.array(dims, np.int64), "s")
    node = helper.make_node("ConstantOfShape", ["s"], ["y"], name="cos")
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["a"] * len(dims))
    graph = helper.make_graph([node], "g", [], [y], [shape])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()


def test_folding_a_terabyte_constant_of_shape_is_a_resource_error_under_the_default_budget():
    data = _constant_of_shape([2**20, 2**20])
    assert len(data) < 150
    with pytest.raises(
        ResourceError,
        match=r"constant folding of layer 'cos' \(ConstantOfShape\) needs 4,398,046,511,104 bytes, over the "
        r"memory budget of [\d,]+ bytes.*\(the default, half the machine's physical memory",
    ):
        flowrt.optimize(flowrt.onnx.load(data), backends=["CpuRef"])


def test_sizes_past_int64_are_counted_exactly_not_overflowed():
    with pytest.raises(ResourceError, match="needs 73,786,976,294,838,206,464 bytes"):
        flowrt.optimize(flowrt.onnx.load(_constant_of_shape([2**62, 4])), backends=["CpuRef"])


def test_memory_budget_of_optimize_bounds_what_folding_makes():
    net = flowrt.onnx.load(_constant_of_shape([1000, 1000]))
    with pytest.raises(
        ResourceError, match=r"'cos' .* needs 4,000,000 bytes, over the memory budget of 1,000,000 bytes"
    ):
        flowrt.optimize(net, options=flowrt.OptimizerOptions(memory_budget=10**6), backends=["CpuRef"])
    folded = flowrt.optimize(
        net, options=flowrt.OptimizerOptions(memory_budget=5 * 10**6), backends=["CpuRef"]
    )
    assert "folded 1 constant layer(s) (ConstantOfShape)" in folded.passes


@pytest.mark.parametrize(
    "kind, inputs",
    [
        ("Expand", [np.ones((1, 1), np.float32), np.array([4000, 1000], np.int64)]),
        ("Tile", [np.ones((10, 10), np.float32), np.array([400, 100], np.int64)]),
        ("Range", [np.int64(0), np.int64(10**6), np.int64(1)]),
    ],
)
def test_each_folded_layer_is_claimed_before_it_is_evaluated(kind, inputs):
    net = flowrt.Network()
    net.add_output("y", net.add_layer(kind, inputs=inputs, name="big"))
    with pytest.raises(
        ResourceError, match=rf"constant folding of layer 'big' \({kind}\) needs [\d,]+ bytes"
    ):
        flowrt.optimize(net, options=flowrt.OptimizerOptions(memory_budget=10**6), backends=["CpuRef"])


def _relu(rows: int) -> flowrt.OptimizedNetwork:
    net = flowrt.Network()
    x = net.add_input("x", TensorInfo((rows, 1000)))
    net.add_output("y", net.add_layer("Relu", inputs=[x], name="relu"))
    return flowrt.optimize(net, backends=["CpuRef"])


async def test_a_load_whose_arenas_pass_the_runtime_budget_is_refused_naming_the_layer():
    async with flowrt.Runtime(cpu_workers=1, memory_budget=10**6) as rt:
        with pytest.raises(
            ResourceError,
            match=r"output 0 float32\(1000, 1000\) of layer 'relu' \(Relu\) needs 4,000,000 bytes, over the "
            r"memory budget of 1,000,000 bytes \(set by Runtime\(memory_budget=...\)\)",
        ):
            await rt.load(_relu(1000))
        with pytest.raises(
            ResourceError,
            match=r"4 memory pool\(s\) of arenas: CpuRef 400,000 bytes; the largest tensor, 400,000 bytes, is the output of layer 'relu'",
        ):
            await rt.load(_relu(100), max_in_flight=4)
        model = await rt.load(_relu(100), max_in_flight=2)
        assert (await model.run({"x": np.full((100, 1000), -1, np.float32)}))["y"].max() == 0


async def test_the_runtime_budget_counts_the_networks_it_holds_until_they_are_unloaded():
    async with flowrt.Runtime(cpu_workers=1, memory_budget=10**6) as rt:
        first = await rt.load(_relu(200), max_in_flight=1)
        with pytest.raises(ResourceError, match="networks loaded before already hold 800,000 bytes"):
            await rt.load(_relu(100), max_in_flight=1)
        await first.unload()
        await rt.load(_relu(100), max_in_flight=1)


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, "1GB", float("nan")])
def test_a_bad_memory_budget_is_an_argument_error_where_it_is_given(bad):
    with pytest.raises(
        ArgumentError, match=r"OptimizerOptions: memory_budget must be None or a positive int"
    ):
        flowrt.OptimizerOptions(memory_budget=bad)
    with pytest.raises(ArgumentError, match=r"Runtime: memory_budget must be None or a positive int"):
        flowrt.Runtime(memory_budget=bad)


def test_the_default_budget_is_half_the_physical_memory():
    assert default_memory_budget() == os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") // 2
    assert flowrt.OptimizerOptions(memory_budget=np.int64(2**30)).memory_budget == 2**30
