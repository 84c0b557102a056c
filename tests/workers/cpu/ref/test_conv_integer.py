"""CpuRef ConvInteger and QLinearConv against onnx's reference and numpy, their shape
inference, and a QLinearConv model through the public API against ONNX Runtime."""

import numpy as np
import onnx
import pytest
import trio
from onnx import TensorProto, helper, numpy_helper
from oracle import assert_matches_reference, run_flowrt_node

import flowrt
from flowrt.engine.graph.layer_kind import get_layer_kind
from flowrt.errors import DataTypeError, ShapeError
from flowrt.frontends.onnx.descriptors import make_descriptor
from flowrt.types import DataType, TensorInfo

RNG = np.random.default_rng(17)


def _ints(dtype, *shape):
    info = np.iinfo(dtype)
    return RNG.integers(info.min, info.max, shape, endpoint=True).astype(dtype)


@pytest.mark.parametrize(
    "attributes",
    [{}, dict(pads=[1, 1, 1, 1]), dict(strides=[2, 2], pads=[1, 0, 1, 0]), dict(group=2, dilations=[2, 1])],
)
@pytest.mark.parametrize("x_type", [np.uint8, np.int8])
def test_conv_integer_matches_the_reference(attributes, x_type):
    x, w = _ints(x_type, 2, 4, 7, 6), _ints(np.int8, 6, 4 // attributes.get("group", 1), 3, 3)
    got = assert_matches_reference("ConvInteger", [x, w, x_type(5), np.int8(-3)], attributes)
    assert got[0].dtype == np.int32
    assert_matches_reference("ConvInteger", [x, w], attributes)


def test_conv_integer_takes_a_weight_zero_point_per_output_channel():
    # onnx's reference broadcasts a per-channel zero point along the last axis: numpy instead.
    x, w = _ints(np.uint8, 1, 3, 5, 5), _ints(np.uint8, 4, 3, 3, 3)
    w_zero_point = np.array([1, 100, 128, 255], np.uint8)
    (got,), infos = run_flowrt_node("ConvInteger", [x, w, np.uint8(9), w_zero_point])
    xs = x.astype(np.int64) - 9
    ws = w.astype(np.int64) - w_zero_point.astype(np.int64)[:, None, None, None]
    expected = _valid_conv(xs, ws)
    np.testing.assert_array_equal(got, expected)
    assert infos[0] == TensorInfo((1, 4, 3, 3), DataType.INT32)


def _valid_conv(x, w):
    """A stride-1, unpadded convolution of integer arrays, tap by tap."""
    k, (h, width) = w.shape[2], x.shape[2:]
    out = np.zeros((x.shape[0], w.shape[0], h - k + 1, width - k + 1), np.int64)
    for i in range(k):
        for j in range(k):
            out += np.einsum(
                "nchw,mc->nmhw", x[:, :, i : i + h - k + 1, j : j + width - k + 1], w[:, :, i, j]
            )
    return out


@pytest.mark.parametrize("y_type", [np.uint8, np.int8])
@pytest.mark.parametrize("per_channel", [False, True])
def test_qlinear_conv_requantizes_with_rounding_and_saturation(y_type, per_channel):
    x, w = _ints(np.uint8, 1, 3, 6, 6), _ints(np.int8, 5, 3, 3, 3)
    w_scale = RNG.uniform(0.001, 0.02, 5).astype(np.float32) if per_channel else np.float32(0.01)
    w_zero_point = np.zeros(5, np.int8) if per_channel else np.int8(0)
    bias = RNG.integers(-2000, 2000, 5).astype(np.int32)
    y_zero_point = y_type(np.iinfo(y_type).max // 2)
    inputs = [
        x,
        np.float32(0.03),
        np.uint8(120),
        w,
        w_scale,
        w_zero_point,
        np.float32(0.04),
        y_zero_point,
        bias,
    ]
    got = assert_matches_reference("QLinearConv", inputs, dict(pads=[1, 1, 1, 1]), atol=0)
    assert got[0].dtype == y_type
    info = np.iinfo(y_type)
    assert (got[0] == info.max).any() and (got[0] == info.min).any(), "the case should saturate both ways"


def _infer(op, infos, **attributes):
    desc = make_descriptor(op, attributes, opset=21, num_outputs=1)
    return get_layer_kind(op).infer(desc, infos, [None] * len(infos))[0]


def test_infer_types_and_shapes():
    u8, i8, f32, i32 = DataType.UINT8, DataType.INT8, DataType.FLOAT32, DataType.INT32
    x, w = TensorInfo(("N", 3, 8, 8), u8), TensorInfo((4, 3, 3, 3), i8)
    assert _infer("ConvInteger", [x, w], strides=[2, 2]) == TensorInfo(("N", 4, 3, 3), i32)
    scalar = TensorInfo((), f32)
    infos = [x, scalar, TensorInfo((), u8), w, TensorInfo((4,), f32), TensorInfo((4,), i8), scalar,
             TensorInfo((), i8), TensorInfo((4,), i32)]  # fmt: skip
    assert _infer("QLinearConv", infos, pads=[1, 1, 1, 1]) == TensorInfo(("N", 4, 8, 8), i8)


def test_infer_rejects_what_is_not_an_8_bit_convolution():
    u8, i8, f32 = DataType.UINT8, DataType.INT8, DataType.FLOAT32
    x, w = TensorInfo((1, 3, 8, 8), u8), TensorInfo((4, 3, 3, 3), i8)
    with pytest.raises(DataTypeError, match="ConvInteger expects x of int8 or uint8, got float32"):
        _infer("ConvInteger", [TensorInfo((1, 3, 8, 8), f32), w])
    with pytest.raises(DataTypeError, match="x_zero_point of its tensor's type uint8, got int8"):
        _infer("ConvInteger", [x, w, TensorInfo((), i8)])
    with pytest.raises(ShapeError, match="x_zero_point of one element"):
        _infer("ConvInteger", [x, w, TensorInfo((3,), u8)])
    with pytest.raises(ShapeError, match="ConvInteger expects 6 input channels"):
        _infer("ConvInteger", [x, w], group=2)
    scalar = TensorInfo((), f32)
    bad_bias = [x, scalar, TensorInfo((), u8), w, scalar, TensorInfo((), i8), scalar, TensorInfo((), u8),
                TensorInfo((4,), f32)]  # fmt: skip
    with pytest.raises(DataTypeError, match="QLinearConv expects B of int32, got float32"):
        _infer("QLinearConv", bad_bias)


def _qlinear_conv_model(x, w, w_scale, bias) -> onnx.ModelProto:
    constants = {
        "x_scale": np.float32(0.02), "x_zero_point": np.uint8(128), "w": w, "w_scale": w_scale,
        "w_zero_point": np.zeros(w.shape[0], np.int8), "y_scale": np.float32(0.05),
        "y_zero_point": np.uint8(100), "B": bias,
    }  # fmt: skip
    node = helper.make_node(
        "QLinearConv",
        ["x", "x_scale", "x_zero_point", "w", "w_scale", "w_zero_point", "y_scale", "y_zero_point", "B"],
        ["y"],
        pads=[1, 1, 1, 1],
        strides=[2, 2],
    )
    graph = helper.make_graph(
        [node],
        "qconv",
        [helper.make_tensor_value_info("x", TensorProto.UINT8, x.shape)],
        [helper.make_tensor_value_info("y", TensorProto.UINT8, (x.shape[0], w.shape[0], 5, 5))],
        [numpy_helper.from_array(np.asarray(v), k) for k, v in constants.items()],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])


def test_a_qlinear_conv_model_matches_onnx_runtime():
    ort = pytest.importorskip("onnxruntime")
    # Weights of 7 bits, as onnxruntime's quantizer makes them for x86 (reduce_range): on AVX2,
    # its u8 x s8 kernels add products in pairs with int16 saturation, and full-range weights
    # make them saturate (they then differ from onnx's reference by tens of steps; flowrt does not).
    x, w = _ints(np.uint8, 2, 8, 9, 9), RNG.integers(-64, 63, (16, 8, 3, 3), endpoint=True).astype(np.int8)
    model = _qlinear_conv_model(x, w, RNG.uniform(0.001, 0.01, 16).astype(np.float32),
                                RNG.integers(-5000, 5000, 16).astype(np.int32))  # fmt: skip
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    (expected,) = session.run(None, {"x": x})

    async def main():
        async with flowrt.Runtime() as rt:
            loaded = await rt.load(flowrt.optimize(flowrt.onnx.load(model)))
            return (await loaded.run({"x": x}))["y"]

    got = trio.run(main)
    assert got.dtype == np.uint8 and got.shape == expected.shape == (2, 16, 5, 5)
    np.testing.assert_array_equal(got, expected)
