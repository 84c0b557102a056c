"""The QDQ fold: Conv, MatMul and Gemm groups of a QDQ model become QLinearConv,
QLinearMatMul and QGemm, whose results are ONNX Runtime's (which folds the same groups for its CPU kernels)."""

from __future__ import annotations

import numpy as np
import onnxruntime
import pytest
import trio
from onnx import ModelProto, TensorProto, helper, numpy_helper
from qdqmodels import qdq_conv_model, qdq_gemm_model

import flowrt
from flowrt.engine.graph.passes.fold_qdq import fold_qdq


def _take_all(kind, descriptor, inputs, outputs):
    return True


def _subject(change: str) -> str:
    """The kind a change names first: "folded QDQ group of Conv ..." -> Conv."""
    words = change.split()
    return words[4] if change.startswith("folded") else words[0]


def _kinds(graph) -> list[str]:
    return sorted(layer.kind for layer in graph if layer.kind not in ("Constant", "Input", "Output"))


def _run(graph, x: np.ndarray, backends=("CpuRef",)) -> np.ndarray:
    opt = flowrt.optimize(graph, backends=list(backends), options=flowrt.OptimizerOptions(fold_qdq=False))

    async def main():
        async with flowrt.Runtime() as rt:
            model = await rt.load(opt)
            return (await model.run({"x": x}))["y"]

    return trio.run(main)


def _ort(model, x: np.ndarray) -> np.ndarray:
    session = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, {"x": x})[0]


@pytest.mark.parametrize("reduce_range", [True, False])
def test_conv_and_matmul_groups_fold_and_match_onnx_runtime(reduce_range):
    rng = np.random.default_rng(3)
    model = qdq_conv_model(rng, reduce_range=reduce_range)
    graph = flowrt.onnx.load(model).graph.copy()
    changes = fold_qdq(graph, _take_all)
    assert [_subject(c) for c in changes] == ["Conv", "Reshape", "MatMul"]
    # The groups' DequantizeLinear layers (input, weights, bias) and QuantizeLinear are gone,
    # and the Reshape between two of the same parameters moves the uint8 values:
    # Q(x) -> QLinearConv -> Reshape -> QLinearMatMul -> DQ.
    assert _kinds(graph) == sorted(
        ["QuantizeLinear", "QLinearConv", "Reshape", "QLinearMatMul", "DequantizeLinear"]
    )
    x = rng.uniform(-2, 2, (1, 8, 10, 10)).astype(np.float32)
    folded = _run(graph, x)
    # Unfolded, the float products of dequantized values land within a step or two of y's.
    unfolded = _run(flowrt.onnx.load(model).graph, x)
    np.testing.assert_allclose(unfolded, folded, atol=2 * 0.03 + 1e-6)
    assert np.mean(unfolded != folded) < 0.1
    if reduce_range:  # 7-bit weights: ONNX Runtime's u8s8 products are exact, and equal ours
        np.testing.assert_array_equal(folded, _ort(model, x))
    # (With full-range weights its AVX2 kernel saturates pairs of products; ours are exact.)


@pytest.mark.parametrize("trans_b", [1, 0])
def test_a_gemm_group_folds_into_qgemm_on_cpuacc_and_matches_onnx_runtime(trans_b):
    rng = np.random.default_rng(5)
    model = qdq_gemm_model(rng, rows=3, reduction=200, columns=50, trans_b=trans_b)
    opt = flowrt.optimize(flowrt.onnx.load(model), backends=["CpuAcc", "CpuRef"])
    placed = {
        layer.kind: opt.decisions[layer.name].backend for layer in opt.graph if layer.name in opt.decisions
    }
    assert placed == {"QuantizeLinear": "CpuAcc", "QGemm": "CpuAcc", "DequantizeLinear": "CpuAcc"}
    assert any("folded QDQ group of Gemm" in p for p in opt.passes)
    x = rng.uniform(-2, 2, (3, 200)).astype(np.float32)

    async def main():
        async with flowrt.Runtime() as rt:
            return (await (await rt.load(opt)).run({"x": x}))["y"]

    np.testing.assert_array_equal(trio.run(main), _ort(model, x))


def test_a_gemm_group_without_a_bias_folds_into_a_qgemm_without_c():
    """C is an optional input of QGemm: the fold leaves it out where the Gemm has no bias."""
    rng = np.random.default_rng(6)
    model = qdq_gemm_model(rng, rows=2, reduction=64, columns=10, bias=False)
    opt = flowrt.optimize(flowrt.onnx.load(model), backends=["CpuAcc", "CpuRef"])
    (qgemm,) = [layer for layer in opt.graph if layer.kind == "QGemm"]
    assert qgemm.inputs[6].source is None
    x = rng.uniform(-2, 2, (2, 64)).astype(np.float32)

    async def main():
        async with flowrt.Runtime() as rt:
            return (await (await rt.load(opt)).run({"x": x}))["y"]

    np.testing.assert_array_equal(trio.run(main), _ort(model, x))


def test_a_gemm_with_alpha_stays_float():
    model = qdq_gemm_model(np.random.default_rng(5))
    next(n for n in model.graph.node if n.op_type == "Gemm").attribute.append(
        helper.make_attribute("alpha", 0.5)
    )
    graph = flowrt.onnx.load(model).graph.copy()
    assert fold_qdq(graph, _take_all) == []
    assert "Gemm" in _kinds(graph)


def test_nothing_folds_where_no_backend_takes_the_quantized_layers():
    model = qdq_conv_model(np.random.default_rng(4))
    graph = flowrt.onnx.load(model).graph.copy()
    before = _kinds(graph)
    assert fold_qdq(graph, lambda *args: False) == []
    assert _kinds(graph) == before
    assert not [layer for layer in graph if layer.kind == "Constant" and not layer.outputs[0].connections]


def test_on_cpu_ref_alone_optimize_leaves_the_groups_as_they_are():
    model = qdq_conv_model(np.random.default_rng(5))
    opt = flowrt.optimize(flowrt.onnx.load(model), backends=["CpuRef"])
    assert "QLinearConv" not in {layer.kind for layer in opt.graph}
    assert not any("QDQ" in p for p in opt.passes)


def test_a_conv_whose_output_has_another_reader_is_left_float():
    model = qdq_conv_model(np.random.default_rng(6))
    model.graph.output.append(helper.make_tensor_value_info("c", TensorProto.FLOAT, [1, 16, 10, 10]))
    graph = flowrt.onnx.load(model).graph.copy()
    changes = fold_qdq(graph, _take_all)
    assert [_subject(c) for c in changes] == ["Reshape", "MatMul"]
    assert "Conv" in _kinds(graph)


def test_a_mover_between_different_parameters_keeps_its_quantizers():
    rng = np.random.default_rng(8)
    model = qdq_conv_model(rng, flat_zero_point=121)  # the Reshape's Q: another zero point
    graph = flowrt.onnx.load(model).graph.copy()
    assert [_subject(c) for c in fold_qdq(graph, _take_all)] == ["Conv", "MatMul"]
    x = rng.uniform(-2, 2, (1, 8, 10, 10)).astype(np.float32)
    np.testing.assert_array_equal(_run(graph, x), _ort(model, x))


def _qdq_max_pool_model(scale: float) -> ModelProto:
    """x -> Q -> DQ -> MaxPool 3x3/2 (pad 1) -> Q -> DQ -> y, one scale and zero point."""
    inits = [
        numpy_helper.from_array(np.array(scale, np.float32), "s"),
        numpy_helper.from_array(np.array(100, np.uint8), "z"),
    ]
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "s", "z"], ["xq"]),
        helper.make_node("DequantizeLinear", ["xq", "s", "z"], ["xd"]),
        helper.make_node("MaxPool", ["xd"], ["p"], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]),
        helper.make_node("QuantizeLinear", ["p", "s", "z"], ["pq"]),
        helper.make_node("DequantizeLinear", ["pq", "s", "z"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 12, 12])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 6, 6])],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


def test_a_max_pool_between_quantizers_of_a_positive_scale_pools_the_8_bit_values():
    model = _qdq_max_pool_model(0.05)
    graph = flowrt.onnx.load(model).graph.copy()
    assert [_subject(c) for c in fold_qdq(graph, _take_all)] == ["MaxPool"]
    assert _kinds(graph) == ["DequantizeLinear", "MaxPool", "QuantizeLinear"]
    x = np.random.default_rng(3).uniform(-5, 5, (1, 4, 12, 12)).astype(np.float32)
    folded = _run(graph, x, backends=("CpuAcc", "CpuRef"))
    np.testing.assert_array_equal(folded, _ort(model, x))
    np.testing.assert_array_equal(folded, _run(flowrt.onnx.load(model).graph.copy(), x))


def test_a_max_pool_between_quantizers_of_a_negative_scale_stays_float():
    # dequantizing by a negative scale reverses the order: the quantized values' max is the min
    graph = flowrt.onnx.load(_qdq_max_pool_model(-0.05)).graph.copy()
    assert fold_qdq(graph, _take_all) == []
