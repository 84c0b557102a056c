"""CpuAcc QuantizeLinear and DequantizeLinear against CpuRef, per tensor between float32 and
uint8 or int8; other forms declined; a QDQ model through the public API against ONNX Runtime."""

import numpy as np
import pytest
import trio
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from onnx import TensorProto, helper, numpy_helper

import flowrt
from flowrt.registry import WorkloadInfo
from flowrt.types import TensorInfo
from flowrt.workers.cpu.acc.kernels import load_all as acc_kernels
from flowrt.workers.cpu.ref.kernels import load_all as ref_kernels


def _info(kind, desc, inputs, expected):
    infos = tuple(None if a is None else TensorInfo.of(a) for a in inputs)
    return WorkloadInfo("layer", kind, desc, infos, (TensorInfo.of(expected),), (None,) * len(inputs))


def _run_both(kind, desc, inputs, workers, given_outputs):
    expected = ref_kernels()[kind](desc, *inputs)
    info = _info(kind, desc, inputs, expected)
    assert acc_kernels()[kind].supports(info).supported
    outputs = [np.empty(expected.shape, expected.dtype)] if given_outputs else None
    (got,) = acc_kernels()[kind](info, workers).execute(inputs, outputs)
    if given_outputs:
        assert got is outputs[0]
    assert got.dtype == expected.dtype and got.shape == expected.shape
    return got, expected


SIDES = hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=40)


@settings(max_examples=40, deadline=None)
@given(
    data=st.data(),
    dtype=st.sampled_from([np.uint8, np.int8]),
    scale=st.sampled_from([0.5, 0.02, 1e-3, 3.0]),
    workers=st.sampled_from([1, 2, 4]),
    given_outputs=st.booleans(),
    with_zero=st.booleans(),
)
def test_quantize_matches_cpuref(data, dtype, scale, workers, given_outputs, with_zero):
    # Halves of the scale land on ties (round half to even); the range also saturates.
    ties = st.sampled_from([0.5 * scale, 1.5 * scale, -2.5 * scale, 1e9, -1e9])
    x = data.draw(hnp.arrays(np.float32, SIDES, elements=st.floats(-300, 300, width=32) | ties))
    info = np.iinfo(dtype)
    zero = dtype(data.draw(st.integers(info.min, info.max))) if with_zero else None
    inputs = [x, np.float32(scale)] + ([np.array(zero, dtype)] if with_zero else [])
    if not with_zero and dtype is np.int8:
        desc = flowrt.descriptors.QuantizeLinear(output_dtype=3)  # int8 without a zero point
    else:
        desc = flowrt.descriptors.QuantizeLinear()
    got, expected = _run_both("QuantizeLinear", desc, inputs, workers, given_outputs)
    np.testing.assert_array_equal(got, expected)


@settings(max_examples=30, deadline=None)
@given(
    data=st.data(),
    dtype=st.sampled_from([np.uint8, np.int8]),
    scale=st.floats(2**-13, 10, width=32),
    workers=st.sampled_from([1, 2]),
    given_outputs=st.booleans(),
)
def test_dequantize_matches_cpuref(data, dtype, scale, workers, given_outputs):
    x = data.draw(hnp.arrays(dtype, SIDES))
    zero = data.draw(hnp.arrays(dtype, ()))
    inputs = [x, np.float32(scale), zero]
    got, expected = _run_both(
        "DequantizeLinear", flowrt.descriptors.DequantizeLinear(), inputs, workers, given_outputs
    )
    np.testing.assert_array_equal(got, expected)


def test_large_tensors_split_across_workers_give_cpurefs_values():
    x = np.random.default_rng(2).standard_normal(300_000).astype(np.float32) * 4
    q, expected = _run_both(
        "QuantizeLinear", flowrt.descriptors.QuantizeLinear(), [x, np.float32(0.03), np.uint8(128)], 2, True
    )
    np.testing.assert_array_equal(q, expected)
    y, expected = _run_both(
        "DequantizeLinear",
        flowrt.descriptors.DequantizeLinear(),
        [q, np.float32(0.03), np.uint8(128)],
        2,
        False,
    )
    np.testing.assert_array_equal(y, expected)


@pytest.mark.parametrize(
    "kind, inputs, why",
    [
        (
            "QuantizeLinear",
            [np.zeros((2, 3), np.float32), np.ones(3, np.float32), np.zeros(3, np.uint8)],
            "scale of one element",
        ),
        ("QuantizeLinear", [np.zeros(3, np.float32), np.float32(1), np.int16(0)], "uint8 or int8"),
        ("QuantizeLinear", [np.zeros(3, np.float64), np.float64(1), np.uint8(0)], "float32 data"),
        ("DequantizeLinear", [np.zeros(3, np.int32), np.float32(1)], "uint8 or int8 data"),
        (
            "DequantizeLinear",
            [np.zeros((2, 3), np.uint8), np.ones(2, np.float32), np.zeros(2, np.uint8)],
            "scale of one element",
        ),
    ],
)
def test_other_forms_are_declined_with_the_reason(kind, inputs, why):
    desc = (
        flowrt.descriptors.QuantizeLinear(axis=1)
        if kind == "QuantizeLinear"
        else flowrt.descriptors.DequantizeLinear(axis=0)
    )
    expected = ref_kernels()[kind](desc, *inputs)
    support = acc_kernels()[kind].supports(_info(kind, desc, inputs, expected))
    assert not support.supported and why in support.reason


def _qdq_conv_model():
    rng = np.random.default_rng(4)
    weights = (rng.integers(-64, 63, (8, 4, 3, 3), endpoint=True)).astype(np.int8)
    constants = {
        "s_x": np.float32(0.05), "z_x": np.uint8(120), "w_q": weights, "s_w": np.float32(0.01), "z_w": np.int8(0),
        "b": rng.standard_normal(8).astype(np.float32), "s_y": np.float32(0.1), "z_y": np.uint8(100),
    }  # fmt: skip
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "s_x", "z_x"], ["xq"]),
        helper.make_node("DequantizeLinear", ["xq", "s_x", "z_x"], ["xd"]),
        helper.make_node("DequantizeLinear", ["w_q", "s_w", "z_w"], ["w"]),
        helper.make_node("Conv", ["xd", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c"], ["r"]),
        helper.make_node("QuantizeLinear", ["r", "s_y", "z_y"], ["yq"]),
        helper.make_node("DequantizeLinear", ["yq", "s_y", "z_y"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "qdq",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, (2, 4, 10, 10))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, (2, 8, 10, 10))],
        [numpy_helper.from_array(np.asarray(v), k) for k, v in constants.items()],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])


def test_a_qdq_model_runs_its_quantizers_on_cpuacc_and_matches_onnx_runtime():
    ort = pytest.importorskip("onnxruntime")
    model = _qdq_conv_model()
    x = np.random.default_rng(5).standard_normal((2, 4, 10, 10)).astype(np.float32) * 3
    (expected,) = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, {"x": x}
    )
    opt = flowrt.optimize(flowrt.onnx.load(model), backends=["CpuAcc", "CpuRef"])
    placed = {layer.kind: layer.backend for layer in opt.graph if layer.backend}
    assert placed["QuantizeLinear"] == placed["DequantizeLinear"] == "CpuAcc"

    async def main():
        async with flowrt.Runtime() as rt:
            return (await (await rt.load(opt)).run({"x": x}))["y"]

    got = trio.run(main)
    # Both dequantize the same uint8 steps: within one step (0.1) where a sum lands on a tie.
    np.testing.assert_allclose(got, expected, rtol=0, atol=0.1 + 1e-6)
    assert np.mean(got == expected) > 0.99
