"""QLinearAdd and QLinearMul: CpuAcc's kernel against CpuRef's on hypothesis shapes; the QDQ
fold that makes them, through the public API, bit for bit what the unfolded group gives."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

import flowrt
from flowrt.engine.graph.layer_kind import NoDescriptor
from flowrt.errors import DataTypeError, ShapeError
from flowrt.registry import WorkloadInfo
from flowrt.types import TensorInfo
from flowrt.workers.cpu.acc.kernels import load_all as acc_kernels
from flowrt.workers.cpu.acc.kernels.qlinear_binary import MIN_ROW
from flowrt.workers.cpu.ref.kernels import load_all as ref_kernels


def _inputs(rng, a_shape, b_shape, a_type, b_type, c_type):
    def values(shape, dtype):
        if dtype is np.float32:
            return rng.standard_normal(shape).astype(np.float32)
        info = np.iinfo(dtype)
        return rng.integers(info.min, info.max + 1, shape).astype(dtype)

    def zero(dtype):
        info = np.iinfo(dtype)
        return np.array(rng.integers(info.min, info.max + 1), dtype)

    a, b = values(a_shape, a_type), values(b_shape, b_type)
    b_params = (
        [np.float32(1), np.float32(0)]
        if b_type is np.float32
        else [np.float32(rng.uniform(0.005, 0.1)), zero(b_type)]
    )
    return [
        a,
        np.float32(rng.uniform(0.005, 0.1)),
        zero(a_type),
        b,
        *b_params,
        np.float32(0.05),
        zero(c_type),
    ]


A_SHAPES = st.sampled_from([(1, 8, 5, 7), (2, 3, 40), (1, 64), (130,), (1, 2, 2, 33)])


@settings(max_examples=40, deadline=None)
@given(
    a_shape=A_SHAPES,
    broadcast=st.sampled_from(["same", "row", "scalar", "rows"]),
    kind=st.sampled_from(["QLinearAdd", "QLinearMul"]),
    a_type=st.sampled_from([np.uint8, np.int8]),
    b_type=st.sampled_from([np.uint8, np.int8, np.float32]),
    c_type=st.sampled_from([np.uint8, np.int8]),
    workers=st.sampled_from([1, 2, 3]),
    given_outputs=st.booleans(),
    smaller_first=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_cpuacc_matches_cpuref(
    a_shape, broadcast, kind, a_type, b_type, c_type, workers, given_outputs, smaller_first, seed
):
    """``smaller_first``: the broadcast operand is A (as ONNX Runtime's QOperator format writes
    a bias), which CpuAcc takes the other way round."""
    b_shape = {
        "same": a_shape,
        "row": (a_shape[-1],),
        "scalar": (),
        "rows": (1, *a_shape[-2:]) if len(a_shape) >= 3 else a_shape[-1:],
    }[broadcast]
    if smaller_first and b_type is np.float32:  # A is 8-bit
        b_type = np.uint8
    inputs = _inputs(np.random.default_rng(seed), a_shape, b_shape, a_type, b_type, c_type)
    if smaller_first:
        inputs = inputs[3:6] + inputs[0:3] + inputs[6:]
    expected = ref_kernels()[kind](NoDescriptor(), *inputs)
    info = WorkloadInfo(
        "layer",
        kind,
        NoDescriptor(),
        tuple(TensorInfo.of(np.asarray(x)) for x in inputs),
        (TensorInfo.of(expected),),
    )
    support = acc_kernels()[kind].supports(info)
    b_size = int(np.prod(b_shape, dtype=np.int64))
    if 1 < b_size < MIN_ROW and b_size != int(np.prod(a_shape)):
        assert not support.supported and "rows of" in support.reason
        return
    assert support.supported, support.reason
    outputs = [np.empty(expected.shape, expected.dtype)] if given_outputs else None
    (got,) = acc_kernels()[kind](info, workers).execute(inputs, outputs)
    assert got.dtype == expected.dtype and got.shape == expected.shape
    np.testing.assert_array_equal(got, expected)


def test_a_b_that_is_not_a_trailing_part_of_a_is_declined():
    rng = np.random.default_rng(0)
    inputs = _inputs(rng, (1, 4, 64, 64), (1, 4, 1, 1), np.uint8, np.uint8, np.uint8)
    expected = ref_kernels()["QLinearAdd"](NoDescriptor(), *inputs)
    info = WorkloadInfo(
        "layer",
        "QLinearAdd",
        NoDescriptor(),
        tuple(TensorInfo.of(np.asarray(x)) for x in inputs),
        (TensorInfo.of(expected),),
    )
    support = acc_kernels()["QLinearAdd"].supports(info)
    assert not support.supported and "trailing part" in support.reason


def test_shape_inference_names_a_wrong_input():
    from flowrt.engine.graph.layer_kind import get_layer_kind

    infer = get_layer_kind("QLinearAdd").infer
    u8, f32 = TensorInfo((1, 4), flowrt.DataType.UINT8), TensorInfo((), flowrt.DataType.FLOAT32)
    zp = TensorInfo((), flowrt.DataType.UINT8)
    (out,) = infer(
        NoDescriptor(),
        [
            u8,
            f32,
            zp,
            TensorInfo((4,), flowrt.DataType.FLOAT32),
            f32,
            TensorInfo((), flowrt.DataType.FLOAT32),
            f32,
            zp,
        ],
        [None] * 8,
    )
    assert out == TensorInfo((1, 4), flowrt.DataType.UINT8)
    with pytest.raises(DataTypeError, match="input A"):
        infer(NoDescriptor(), [f32, f32, zp, u8, f32, zp, f32, zp], [None] * 8)
    with pytest.raises(DataTypeError, match="B: a zero point of its input's type uint8"):
        infer(
            NoDescriptor(), [u8, f32, zp, u8, f32, TensorInfo((), flowrt.DataType.INT8), f32, zp], [None] * 8
        )
    with pytest.raises(ShapeError, match="C's scale must hold one value"):
        infer(
            NoDescriptor(),
            [u8, f32, zp, u8, f32, zp, TensorInfo((2,), flowrt.DataType.FLOAT32), zp],
            [None] * 8,
        )


def _qdq(nodes, inits, x, scale, zero, out):
    inits += [
        numpy_helper.from_array(np.array(scale, np.float32), f"{out}_s"),
        numpy_helper.from_array(np.array(zero, np.uint8), f"{out}_z"),
    ]
    nodes += [
        helper.make_node("QuantizeLinear", [x, f"{out}_s", f"{out}_z"], [f"{out}_q"]),
        helper.make_node("DequantizeLinear", [f"{out}_q", f"{out}_s", f"{out}_z"], [out]),
    ]


def _binary_model(rng) -> bytes:
    """x, r (1, 3, 40) -> QDQ -> Add -> QDQ -> + bias row (float) -> QDQ -> * 0.75 -> QDQ -> y."""
    nodes, inits = [], []
    _qdq(nodes, inits, "x", 0.03, 128, "xd")
    _qdq(nodes, inits, "r", 0.02, 120, "rd")
    nodes.append(helper.make_node("Add", ["xd", "rd"], ["s"]))
    _qdq(nodes, inits, "s", 0.04, 125, "sd")
    inits.append(numpy_helper.from_array(rng.standard_normal(40).astype(np.float32), "bias"))
    nodes.append(helper.make_node("Add", ["bias", "sd"], ["t"]))  # the constant first
    _qdq(nodes, inits, "t", 0.05, 130, "td")
    inits.append(numpy_helper.from_array(np.array(0.75, np.float32), "k"))
    nodes.append(helper.make_node("Mul", ["td", "k"], ["u"]))
    _qdq(nodes, inits, "u", 0.03, 127, "y")
    info = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [1, 3, 40]) for n in ("x", "r")]
    graph = helper.make_graph(
        nodes, "binary", info, [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 3, 40])], inits
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model.SerializeToString()


async def test_the_fold_makes_one_layer_of_each_group_and_gives_the_groups_bits():
    model = _binary_model(np.random.default_rng(0))
    fused = flowrt.optimize(flowrt.onnx.load(model), backends=["CpuAcc", "CpuRef"])
    kinds = [layer.kind for layer in fused.graph if layer.kind not in ("Input", "Output", "Constant")]
    assert kinds.count("QLinearAdd") == 2 and kinds.count("QLinearMul") == 1 and "Add" not in kinds
    assert all(layer.backend == "CpuAcc" for layer in fused.graph if layer.kind.startswith("QLinear"))
    assert sum("into QLinearAdd" in change for change in fused.passes) == 2
    # CpuRef alone folds nothing: the group as written, each step its own kernel
    plain = flowrt.optimize(flowrt.onnx.load(model), backends=["CpuRef"])
    assert "QLinearAdd" not in [layer.kind for layer in plain.graph]
    rng = np.random.default_rng(1)
    async with flowrt.Runtime() as rt:
        one, other = await rt.load(fused), await rt.load(plain)
        for _ in range(3):
            feeds = {n: rng.standard_normal((1, 3, 40)).astype(np.float32) * 3 for n in ("x", "r")}
            got, want = (await one.run(feeds))["y"], (await other.run(feeds))["y"]
            np.testing.assert_array_equal(got, want)
            assert np.unique(got).size > 10  # values, not one saturated level
