"""ONNX's low-precision types (bfloat16, float8, float6, float4, int4, int2) as ml_dtypes arrays:
the DataType mapping, Cast and QuantizeLinear on CpuRef against onnx's reference, initializers
(packed 4- and 2-bit ones included) through the public API, .flowrt files, and CpuAcc declining."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from oracle import run_flowrt_node, run_onnx_reference

import flowrt
from flowrt import serialize
from flowrt.engine.graph.encoding import decode_value, encode_value
from flowrt.engine.graph.layers.elementwise import CastDescriptor, onnx_dtype_to_datatype
from flowrt.errors import DataTypeError, ModelLoadError
from flowrt.registry import WorkloadInfo
from flowrt.types import DataType, TensorInfo
from flowrt.workers.cpu.acc.kernels.cast import CastKernel

D = DataType
LOW_PRECISION = [d for d in DataType if d.is_low_precision]
ONNX_CODES = {d: code for code in range(16, 29) for d in [onnx_dtype_to_datatype(code)]}
FLOAT8 = [D.FLOAT8E4M3FN, D.FLOAT8E4M3FNUZ, D.FLOAT8E5M2, D.FLOAT8E5M2FNUZ]
# Normal, tied, tiny, huge and special values: every rounding and saturation rule sees some.
SAMPLES = np.array(
    [0.0, -0.0, 0.3, -1.7, 2.5, 3.5, 7.9, -8.5, 15.0, 17.0, 300.0, 470.0, 1e6, -1e6, 1e-7, np.nan, np.inf, -np.inf],
    dtype=np.float32,
)  # fmt: skip


def _same(got: np.ndarray, expected: np.ndarray) -> None:
    """Equal dtype, shape and values (NaN equal to NaN, -0 to 0 unless the bits matter)."""
    assert got.dtype == expected.dtype and got.shape == expected.shape
    np.testing.assert_array_equal(got.astype(np.float64), expected.astype(np.float64))


def _run_model(model: onnx.ModelProto, feeds: dict, backends=("CpuRef",)) -> list[np.ndarray]:
    session = flowrt.InferenceSession(model.SerializeToString(), backends=list(backends))
    return session.run(None, feeds)


# -- the data types -----------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", LOW_PRECISION, ids=lambda d: d.name)
def test_each_low_precision_type_is_an_ml_dtypes_dtype_and_onnxs(dtype):
    assert dtype.numpy == np.dtype(getattr(ml_dtypes, dtype.value))
    assert DataType.from_numpy(dtype.numpy) is dtype
    assert TensorInfo.of(np.zeros((2, 3), dtype.numpy)) == TensorInfo((2, 3), dtype)
    assert dtype.numpy == onnx.helper.tensor_dtype_to_np_dtype(ONNX_CODES[dtype])
    assert dtype.itemsize == (2 if dtype is D.BFLOAT16 else 1)


def test_a_dtype_met_again_maps_to_the_same_type_and_unknown_ones_keep_failing():
    for dtype in (np.dtype(np.float32), np.dtype(">f4"), np.dtype(np.int64), np.dtype(np.bool_)):
        first = DataType.from_numpy(dtype)
        assert DataType.from_numpy(dtype) is first is DataType.from_numpy(dtype.type)
    assert DataType.from_numpy(np.dtype(">f4")) is DataType.FLOAT32
    assert DataType.from_numpy(np.dtype("U3")) is DataType.from_numpy(np.dtype("U7")) is DataType.STRING
    for _ in range(2):
        with pytest.raises(DataTypeError, match="has no flowrt DataType"):
            DataType.from_numpy(np.dtype([("a", "f4")]))


def test_bits_and_kinds_are_onnxs():
    assert [D.INT4.bits, D.FLOAT4E2M1.bits, D.FLOAT6E3M2.bits, D.UINT2.bits, D.BFLOAT16.bits] == [
        4,
        4,
        6,
        2,
        16,
    ]
    assert D.FLOAT8E8M0.is_float and not D.INT4.is_float and not D.FLOAT32.is_low_precision


# -- Cast ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [d for d in LOW_PRECISION if d is not D.FLOAT8E8M0], ids=lambda d: d.name)
@pytest.mark.parametrize("saturate", [1, 0])
def test_cast_from_float32_and_back_matches_onnx_reference(dtype, saturate):
    attrs = {"to": ONNX_CODES[dtype], "saturate": saturate}
    (expected,) = run_onnx_reference("Cast", [SAMPLES], attrs, opset=25)
    (got,), (info,) = run_flowrt_node("Cast", [SAMPLES], attrs, opset=25)
    assert info.dtype is dtype
    _same(got, expected)
    back = {"to": TensorProto.FLOAT}
    _same(
        run_flowrt_node("Cast", [got], back, opset=25)[0][0],
        run_onnx_reference("Cast", [got], back, opset=25)[0],
    )


@pytest.mark.parametrize("round_mode", ["up", "down", "nearest"])
def test_cast_to_float8e8m0_matches_onnx_reference_on_finite_values(round_mode):
    x = np.array([0.125, 0.2, 0.75, 1.0, 1.5, 3.0, 2.9, 1e30, 3e38], dtype=np.float32)
    attrs = {"to": TensorProto.FLOAT8E8M0, "round_mode": round_mode}
    (expected,) = run_onnx_reference("Cast", [x], attrs, opset=25)
    _same(run_flowrt_node("Cast", [x], attrs, opset=25)[0][0], expected)


def test_cast_to_float8e8m0_follows_the_onnx_table_for_special_values():
    x = np.array([0.0, np.inf, np.nan, 3.0, 1e-45], dtype=np.float32)
    saturated = run_flowrt_node("Cast", [x], {"to": TensorProto.FLOAT8E8M0}, opset=25)[0][0]
    # 0 and values below 2**-127 saturate to 2**-127, infinity to 2**127; 3 rounds up to 4.
    assert saturated.view(np.uint8).tolist() == [0, 254, 255, 129, 0]
    attrs = {"to": TensorProto.FLOAT8E8M0, "saturate": 0, "round_mode": "nearest"}
    plain = run_flowrt_node("Cast", [x], attrs, opset=25)[0][0]
    assert plain.view(np.uint8).tolist() == [255, 255, 255, 129, 255]


def test_float8_saturation_clamps_to_the_largest_finite_value():
    x = np.array([1e6, -np.inf, 470.0], dtype=np.float32)
    for saturate, expected in ((1, [448.0, -448.0, 448.0]), (0, [np.nan, np.nan, np.nan])):
        (y,), _ = run_flowrt_node(
            "Cast", [x], {"to": TensorProto.FLOAT8E4M3FN, "saturate": saturate}, opset=25
        )
        np.testing.assert_array_equal(y.astype(np.float32), expected)


def test_cast_between_two_low_precision_types_goes_through_exact_values():
    x = np.array([-8, -1, 0, 7], dtype=ml_dtypes.int4)
    (y,), _ = run_flowrt_node("Cast", [x], {"to": TensorProto.BFLOAT16}, opset=25)
    assert y.dtype == ml_dtypes.bfloat16 and y.astype(np.float32).tolist() == [-8, -1, 0, 7]
    (z,), _ = run_flowrt_node("CastLike", [y, np.zeros(1, ml_dtypes.float8_e5m2)], opset=25)
    assert z.dtype == ml_dtypes.float8_e5m2 and z.astype(np.float32).tolist() == [-8, -1, 0, 7]


# -- QuantizeLinear / DequantizeLinear ----------------------------------------------------------
@pytest.mark.parametrize(
    "zero_point",
    [np.array(1, ml_dtypes.int4), np.array(2, ml_dtypes.uint2), np.array(0, ml_dtypes.float8_e4m3fn),
     np.array(0, ml_dtypes.float4_e2m1fn), np.array(1, ml_dtypes.uint4)],
    ids=lambda z: z.dtype.name,
)  # fmt: skip
def test_quantize_and_dequantize_low_precision_match_onnx_reference(zero_point):
    x = np.array([[-9.0, -2.6, -0.4, 0.0], [0.5, 1.5, 2.5, 100.0]], dtype=np.float32)
    scale = np.float32(0.5)
    inputs = [x, scale, np.asarray(zero_point)]
    (expected,) = run_onnx_reference("QuantizeLinear", inputs, opset=23)
    (q,), (info,) = run_flowrt_node("QuantizeLinear", inputs, opset=23)
    assert info.dtype is DataType.from_numpy(zero_point.dtype)
    _same(q, expected)
    back = [q, scale, np.asarray(zero_point)]
    _same(
        run_flowrt_node("DequantizeLinear", back, opset=23)[0][0],
        run_onnx_reference("DequantizeLinear", back, opset=23)[0],
    )


def test_dequantize_with_a_float8e8m0_scale_needs_and_uses_output_dtype():
    x = np.array([1, -3, 7], dtype=ml_dtypes.int4)
    scale = np.array([0.25, 4.0, 1.0], dtype=np.float32).astype(ml_dtypes.float8_e8m0fnu)
    (y,), (info,) = run_flowrt_node(
        "DequantizeLinear", [x, scale], {"axis": 0, "output_dtype": TensorProto.FLOAT}, opset=23
    )
    assert info.dtype is D.FLOAT32 and y.tolist() == [0.25, -12.0, 7.0]


# -- models through the public API --------------------------------------------------------------
def _initializer_model() -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """Each low-precision initializer feeds a layer that also reads an input (so constant
    folding leaves it to run): a bfloat16 bias, odd-length packed int4 weights dequantized by an
    input scale, float8 factors; and a float8 cast of the input and an int2 constant output."""
    w = numpy_helper.from_array(np.array([0.5, -1.25, 3.0], ml_dtypes.bfloat16), "w")
    q4 = numpy_helper.from_array(np.array([-8, 7, 3, -1, 0], ml_dtypes.int4), "q4")
    u2 = numpy_helper.from_array(np.array([3, 0, 1, 2, 3], ml_dtypes.uint2), "u2")
    f8 = numpy_helper.from_array(np.array([1.5, -448.0, 0.0], ml_dtypes.float8_e4m3fn), "f8")
    nodes = [
        helper.make_node("CastLike", ["w", "x"], ["wf"]),
        helper.make_node("Add", ["x", "wf"], ["y"]),
        helper.make_node("DequantizeLinear", ["q4", "s"], ["z"]),
        helper.make_node("Cast", ["x"], ["q"], to=TensorProto.FLOAT8E5M2),
        helper.make_node("Identity", ["u2"], ["u"]),
        helper.make_node("CastLike", ["f8", "x"], ["f8c"]),
        helper.make_node("Mul", ["f8c", "x"], ["m"]),
    ]
    outputs = [("y", TensorProto.FLOAT, [3]), ("z", TensorProto.FLOAT, [5]), ("q", TensorProto.FLOAT8E5M2, [3]),
               ("u", TensorProto.UINT2, [5]), ("m", TensorProto.FLOAT, [3])]  # fmt: skip
    graph = helper.make_graph(
        nodes,
        "low_precision",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [3]),
            helper.make_tensor_value_info("s", TensorProto.FLOAT, []),
        ],
        [helper.make_tensor_value_info(*o) for o in outputs],
        initializer=[w, q4, u2, f8],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 23)])
    return model, {"x": np.array([1.0, 2.0, -3.0], np.float32), "s": np.array(0.5, np.float32)}


def test_model_with_bfloat16_float8_int4_and_int2_initializers_matches_onnx_reference():
    model, feeds = _initializer_model()
    onnx.checker.check_model(model)
    expected = onnx.reference.ReferenceEvaluator(model).run(None, feeds)
    got = _run_model(model, feeds)
    for g, e in zip(got, expected, strict=True):
        _same(g, np.asarray(e))
    assert got[1].tolist() == [-4.0, 3.5, 1.5, -0.5, 0.0]  # the odd int4 count unpacked right


def test_ml_dtypes_arrays_are_inputs_and_outputs_of_a_session():
    x = np.array([[1.5, -2.0], [np.inf, 0.0078125]], ml_dtypes.bfloat16)
    graph = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["y"]), helper.make_node("Cast", ["x"], ["i"], to=TensorProto.INT4)],
        "io",
        [helper.make_tensor_value_info("x", TensorProto.BFLOAT16, [2, 2])],
        [helper.make_tensor_value_info("y", TensorProto.BFLOAT16, [2, 2]),
         helper.make_tensor_value_info("i", TensorProto.INT4, [2, 2])],
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 23)])
    y, i = _run_model(model, {"x": x})
    assert y.dtype == ml_dtypes.bfloat16 and y.tobytes() == x.tobytes()
    assert i.dtype == ml_dtypes.int4 and i[0].tolist() == [1, -2]
    with pytest.raises(flowrt.errors.DataTypeError, match="expects bfloat16, got float8_e5m2"):
        _run_model(model, {"x": x.astype(np.float32).astype(ml_dtypes.float8_e5m2)})


def test_packed_raw_data_of_the_wrong_length_is_refused():
    tensor = TensorProto(
        name="u2", data_type=TensorProto.UINT2, dims=[9], raw_data=b"\x00\x00"
    )  # 9 need 3 bytes
    graph = helper.make_graph(
        [helper.make_node("Identity", ["u2"], ["y"])],
        "bad",
        [],
        [helper.make_tensor_value_info("y", TensorProto.UINT2, [9])],
        initializer=[tensor],
    )
    with pytest.raises(ModelLoadError, match="raw_data holds 2 bytes; .* needs 3"):
        flowrt.onnx.load(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 23)]), check=False)


def test_flowrt_file_keeps_low_precision_constants_and_outputs(tmp_path):
    model, feeds = _initializer_model()
    optimized = flowrt.optimize(flowrt.onnx.load(model), backends=["CpuRef"])
    path = tmp_path / "low.flowrt"
    serialize.save(optimized, path)
    loaded = serialize.load(path)
    constants = {
        layer.name: layer.descriptor.value.dtype for layer in loaded.graph if layer.kind == "Constant"
    }
    wanted = {D.INT4, D.UINT2, D.BFLOAT16, D.FLOAT8E4M3FN}
    assert {d.numpy for d in wanted} <= set(constants.values())
    for a, b in zip(
        flowrt.InferenceSession(optimized).run(None, feeds), flowrt.InferenceSession(loaded).run(None, feeds)
    ):
        assert a.dtype == b.dtype and a.tobytes() == b.tobytes()


@pytest.mark.parametrize("dtype", LOW_PRECISION, ids=lambda d: d.name)
def test_low_precision_scalars_encode_and_decode_exactly(dtype):
    scalar = np.array([1.0], np.float32).astype(dtype.numpy)[0]
    data = encode_value(scalar, lambda a, w: 0, "x")
    back = decode_value(data, lambda i, w: np.zeros(0), "x")
    assert back.dtype == dtype.numpy and back == scalar
    with pytest.raises(ModelLoadError, match="not exactly"):
        decode_value(
            ["scalar", [dtype.value, 99 if dtype.bits <= 4 else 1e-300]], lambda i, w: np.zeros(0), "x"
        )


# -- CpuAcc declines ----------------------------------------------------------------------------
def test_cpu_acc_declines_low_precision_casts_and_leaves_them_to_cpu_ref():
    info = WorkloadInfo("c", "Cast", CastDescriptor(to=TensorProto.FLOAT8E4M3FN),
                        (TensorInfo((3,)),), (TensorInfo((3,), D.FLOAT8E4M3FN),))  # fmt: skip
    support = CastKernel.supports(info)
    assert not support.supported and "float8e4m3fn" in support.reason
    model, feeds = _initializer_model()
    optimized = flowrt.optimize(flowrt.onnx.load(model), backends=["CpuAcc", "CpuRef"])
    low = [
        layer for layer in optimized.graph
        if layer.backend and any(i is not None and i.dtype.is_low_precision for i in [*layer.input_infos, *layer.output_infos])
    ]  # fmt: skip
    assert len(low) >= 3 and {layer.backend for layer in low} == {"CpuRef"}
    assert "CpuAcc" in optimized.backend_counts()  # the float32 Add and Mul
    cpu_acc, cpu_ref = _run_model(model, feeds, ("CpuAcc", "CpuRef")), _run_model(model, feeds)
    for a, b in zip(cpu_acc, cpu_ref, strict=True):
        assert a.dtype == b.dtype and a.tobytes() == b.tobytes()
