"""ONNX Runtime's com.microsoft QGemm, loaded from ONNX through the public API, against
onnxruntime itself on the same model and inputs."""

import numpy as np
import onnxruntime
import pytest
import trio
from kernelcases import run_on_acc
from onnx import TensorProto, helper, numpy_helper

import flowrt
from flowrt.errors import DataTypeError, GraphError
from flowrt.workers.cpu.ref.kernels import load_all as ref_kernels


def qgemm_model(rng, m, k, n, *, trans_a=0, trans_b=1, alpha=1.0, per_column=True, bias=True, output="uint8",
                a_type=np.uint8, b_zero=False):  # fmt: skip
    """A (M, K) -> QGemm by constant int8 B -> Y: the node ORT's QOperator quantizer writes."""
    b = rng.integers(-128, 128, (n, k) if trans_b else (k, n)).astype(np.int8)
    count = n if per_column else 1
    b_scale = rng.uniform(0.001, 0.01, count).astype(np.float32).reshape(() if count == 1 else (count,))
    b_zp = (rng.integers(-3, 4, count) if b_zero else np.zeros(count)).astype(np.int8).reshape(b_scale.shape)
    a_zp = np.array(128 if a_type == np.uint8 else 3, a_type)
    inits = [
        numpy_helper.from_array(np.array(0.05, np.float32), "a_scale"),
        numpy_helper.from_array(a_zp, "a_zp"),
        numpy_helper.from_array(b, "b"),
        numpy_helper.from_array(b_scale, "b_scale"),
        numpy_helper.from_array(b_zp, "b_zp"),
    ]
    names = ["a", "a_scale", "a_zp", "b", "b_scale", "b_zp"]
    if bias:
        inits.append(numpy_helper.from_array(rng.integers(-5000, 5000, n).astype(np.int32), "c"))
    names.append("c" if bias else "")
    out_type = TensorProto.FLOAT
    if output != "float32":
        y_type = np.uint8 if output == "uint8" else np.int8
        inits += [
            numpy_helper.from_array(np.array(0.3, np.float32), "y_scale"),
            numpy_helper.from_array(np.array(100 if output == "uint8" else -5, y_type), "y_zp"),
        ]
        names += ["y_scale", "y_zp"]
        out_type = TensorProto.UINT8 if output == "uint8" else TensorProto.INT8
    node = helper.make_node(
        "QGemm", names, ["y"], domain="com.microsoft", alpha=alpha, transA=trans_a, transB=trans_b
    )
    a_proto = TensorProto.UINT8 if a_type == np.uint8 else TensorProto.INT8
    graph = helper.make_graph(
        [node], "qgemm",
        [helper.make_tensor_value_info("a", a_proto, [k, m] if trans_a else [m, k])],
        [helper.make_tensor_value_info("y", out_type, [m, n])],
        inits,
    )  # fmt: skip
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]
    )
    model.ir_version = 8
    return model


def run_flowrt(model, feeds, backends):
    """(y, the backend that ran the QGemm)."""
    opt = flowrt.optimize(flowrt.onnx.load(model), backends=backends)
    (placed,) = [opt.decisions[layer.name].backend for layer in opt.graph if layer.kind == "QGemm"]

    async def main():
        async with flowrt.Runtime() as rt:
            return (await (await rt.load(opt)).run(feeds))["y"]

    return trio.run(main), placed


def run_ort(model, feeds):
    session = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, feeds)[0]


CASES = [
    {"m": 1, "k": 64, "n": 10},
    {"m": 2, "k": 1280, "n": 1000},  # a classifier: its rows split across CpuAcc's workers
    {"m": 5, "k": 33, "n": 7, "per_column": False},
    {"m": 3, "k": 20, "n": 9, "trans_b": 0, "bias": False},
    {"m": 4, "k": 16, "n": 6, "trans_a": 1, "alpha": 0.5},
    {"m": 2, "k": 40, "n": 12, "output": "int8", "a_type": np.int8},
    {"m": 6, "k": 24, "n": 5, "output": "float32"},
    {"m": 3, "k": 17, "n": 8, "a_type": np.int8, "b_zero": True, "output": "int8"},
]


@pytest.mark.parametrize("case", CASES, ids=[str(i) for i in range(len(CASES))])
@pytest.mark.parametrize("backends", [["CpuRef"], ["CpuAcc", "CpuRef"]])
def test_qgemm_matches_onnx_runtime(case, backends):
    rng = np.random.default_rng(len(str(case)))
    model = qgemm_model(rng, **case)
    a_type = case.get("a_type", np.uint8)
    shape = model.graph.input[0].type.tensor_type.shape
    a = rng.integers(np.iinfo(a_type).min, np.iinfo(a_type).max + 1, [d.dim_value for d in shape.dim]).astype(
        a_type
    )
    (got, placed), want = run_flowrt(model, {"a": a}, backends), run_ort(model, {"a": a})
    # CpuAcc takes uint8 A and output, A not transposed; the rest runs on CpuRef
    fast = case.get("output", "uint8") == "uint8" and not case.get("trans_a") and "a_type" not in case
    assert placed == (backends[0] if fast else "CpuRef")
    assert got.dtype == want.dtype and got.shape == want.shape
    if want.dtype == np.float32:
        np.testing.assert_allclose(got, want, rtol=1e-6)
    else:
        np.testing.assert_array_equal(got, want)


def test_a_float_bias_is_refused_with_what_was_expected():
    model = qgemm_model(np.random.default_rng(1), 2, 8, 3)
    bias = next(t for t in model.graph.initializer if t.name == "c")
    bias.CopyFrom(numpy_helper.from_array(np.zeros(3, np.float32), "c"))
    with pytest.raises(DataTypeError, match="QGemm expects C of int32, got float32"):
        flowrt.optimize(flowrt.onnx.load(model), backends=["CpuRef"])


def test_an_output_scale_without_a_zero_point_is_refused():
    model = qgemm_model(np.random.default_rng(1), 2, 8, 3)
    del model.graph.node[0].input[8]
    with pytest.raises(GraphError, match="y_scale and y_zero_point both or neither"):
        flowrt.optimize(flowrt.onnx.load(model, check=False), backends=["CpuRef"])


def test_one_constant_read_as_matmul_and_as_qgemm_weights_is_packed_for_each():
    # the same (square) int8 array: a QLinearMatMul's (K, N) weights and a QGemm's (N, K) ones
    rng = np.random.default_rng(3)
    w = rng.integers(-128, 128, (40, 40)).astype(np.int8)
    a = rng.integers(0, 256, (5, 40)).astype(np.uint8)
    params = [np.float32(0.02), np.uint8(128), w, np.float32(0.01), np.int8(0)]
    out_params = [np.float32(0.5), np.uint8(100)]
    matmul = [a, *params, *out_params]
    qgemm = [a, *params, rng.integers(-999, 999, 40).astype(np.int32), *out_params]
    for kind, desc, inputs in (
        ("QLinearMatMul", flowrt.descriptors.QLinearMatMul(), matmul),
        ("QGemm", flowrt.descriptors.QGemm(transB=1), qgemm),
        ("QLinearMatMul", flowrt.descriptors.QLinearMatMul(), matmul),
    ):
        expected = ref_kernels()[kind](desc, *inputs)
        constants = (None, *(np.asarray(x) for x in inputs[1:]))
        _, got = run_on_acc(kind, desc, inputs, expected, constants, dtype=np.uint8)
        np.testing.assert_array_equal(got, expected)
