"""ONNX Runtime's com.microsoft QLinearGlobalAveragePool, QLinearAveragePool, QLinearSoftmax,
QLinearSigmoid, QLinearLeakyRelu and QLinearConcat (and QLinearAdd / QLinearMul with their
zero points left out), loaded from ONNX through the public API and run on CpuRef, against
onnxruntime itself on the same model and inputs: equal, value for value. A float model that
``onnxruntime.quantization.quantize_static`` turns into these ops agrees within one step."""

import numpy as np
import onnx
import onnxruntime
import pytest
import trio
from onnx import TensorProto, helper, numpy_helper
from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

import flowrt
from flowrt.errors import DataTypeError, GraphError, ShapeError

PROTO = {np.uint8: TensorProto.UINT8, np.int8: TensorProto.INT8, np.float32: TensorProto.FLOAT}


def contrib_model(op, inputs, feeds, params, attributes, out_type, opset=17, out_name="y"):
    """One com.microsoft ``op`` node reading ``inputs`` (names; "" for an omitted one) of which
    ``feeds`` ({name: array}) are graph inputs and ``params`` ({name: array}) initializers;
    Y has the rank of the feeds, its dims unnamed."""
    rank = max(a.ndim for a in feeds.values())
    node = helper.make_node(op, inputs, [out_name], domain="com.microsoft", **attributes)
    graph = helper.make_graph(
        [node], op.lower(),
        [helper.make_tensor_value_info(n, PROTO[a.dtype.type], a.shape) for n, a in feeds.items()],
        [helper.make_tensor_value_info(out_name, PROTO[out_type], [f"d{i}" for i in range(rank)])],
        [numpy_helper.from_array(a, n) for n, a in params.items()],
    )  # fmt: skip
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", opset), helper.make_opsetid("com.microsoft", 1)]
    )
    model.ir_version = 8
    return model


def run_flowrt(model, feeds, backends=("CpuRef",)):
    """The model's first output, run on ``backends`` (CpuRef alone by default)."""
    opt = flowrt.optimize(flowrt.onnx.load(model), backends=list(backends))

    async def main():
        async with flowrt.Runtime() as rt:
            outputs = await (await rt.load(opt)).run(feeds)
            return next(iter(outputs.values()))

    return trio.run(main)


def run_ort(model, feeds):
    session = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, feeds)[0]


def quant_params(rng, dtype, *, y_scale=None):
    """Random per-tensor X_scale, X_zero_point, Y_scale, Y_zero_point of ``dtype``."""
    info = np.iinfo(dtype)
    return {
        "xs": np.array(rng.uniform(0.002, 0.2), np.float32),
        "xz": np.array(rng.integers(info.min, info.max + 1), dtype),
        "ys": np.array(y_scale or rng.uniform(0.002, 0.2), np.float32),
        "yz": np.array(rng.integers(info.min, info.max + 1), dtype),
    }


def random_x(rng, dtype, shape):
    info = np.iinfo(dtype)
    return rng.integers(info.min, info.max + 1, shape).astype(dtype)


def assert_matches_ort(op, x, params, attributes, *, inputs=("x", "xs", "xz", "ys", "yz"), opset=17):
    model = contrib_model(op, list(inputs), {"x": x}, params, attributes, x.dtype.type, opset)
    want = run_ort(model, {"x": x})
    got = run_flowrt(model, {"x": x})
    assert got.dtype == want.dtype and got.shape == want.shape
    np.testing.assert_array_equal(got, want)


DTYPES = pytest.mark.parametrize("dtype", [np.uint8, np.int8], ids=["uint8", "int8"])


@DTYPES
@pytest.mark.parametrize(
    ("op", "attributes"),
    [("QLinearSigmoid", {}), ("QLinearLeakyRelu", {"alpha": 0.1}), ("QLinearLeakyRelu", {"alpha": 0.37})],
)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_lookup_ops_match_ort_on_every_8_bit_value(op, attributes, dtype, seed):
    x = np.arange(256).astype(dtype).reshape(2, 8, 16)  # every value, each a table entry of ORT's
    assert_matches_ort(op, x, quant_params(np.random.default_rng(seed), dtype), attributes)


@DTYPES
@pytest.mark.parametrize("op", ["QLinearSigmoid", "QLinearLeakyRelu"])
def test_lookup_ops_take_omitted_zero_points_as_zero(op, dtype):
    params = quant_params(np.random.default_rng(3), dtype)
    del params["xz"], params["yz"]
    x = np.arange(256).astype(dtype).reshape(16, 16)
    # ORT's kernel reads input 4's definition: Y_zero_point is named "", not left off the end
    assert_matches_ort(op, x, params, {}, inputs=("x", "xs", "", "ys", ""))


@DTYPES
@pytest.mark.parametrize("channels_last", [0, 1])
@pytest.mark.parametrize("shape", [(1, 16, 13, 13), (2, 5, 7, 3), (3, 4, 50), (1, 3, 2, 4, 5)])
def test_global_average_pool_matches_ort(shape, channels_last, dtype):
    rng = np.random.default_rng(len(shape) * 10 + channels_last)
    for _ in range(2):
        x = random_x(rng, dtype, shape)
        assert_matches_ort(
            "QLinearGlobalAveragePool", x, quant_params(rng, dtype), {"channels_last": channels_last}
        )


POOLS = [
    {"kernel_shape": [3, 3]},
    {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1], "strides": [2, 2]},
    {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1], "strides": [2, 2], "count_include_pad": 1},
    {"kernel_shape": [2, 3], "pads": [1, 0, 1, 2], "strides": [2, 2], "ceil_mode": 1, "count_include_pad": 1},
    {"kernel_shape": [2, 3], "pads": [0, 1, 1, 1], "strides": [3, 2], "ceil_mode": 1},
    {"kernel_shape": [3, 3], "auto_pad": "SAME_UPPER", "strides": [2, 2]},
    {"kernel_shape": [7, 7]},  # the whole image: ORT averages it as QLinearGlobalAveragePool
]


@DTYPES
@pytest.mark.parametrize("channels_last", [0, 1])
@pytest.mark.parametrize("attributes", POOLS, ids=range(len(POOLS)))
def test_average_pool_matches_ort(attributes, channels_last, dtype):
    rng = np.random.default_rng(len(str(attributes)) + channels_last)
    x = random_x(rng, dtype, (2, 7, 7, 5) if channels_last else (2, 5, 7, 7))
    assert_matches_ort(
        "QLinearAveragePool", x, quant_params(rng, dtype), {**attributes, "channels_last": channels_last}
    )


@DTYPES
@pytest.mark.parametrize(
    "attributes", [{"kernel_shape": [3]}, {"kernel_shape": [2, 2, 2], "strides": [1, 2, 1]}]
)
def test_average_pool_of_one_and_three_spatial_dims_matches_ort(attributes, dtype):
    rng = np.random.default_rng(7)
    x = random_x(rng, dtype, (2, 3, 9) if len(attributes["kernel_shape"]) == 1 else (1, 2, 4, 5, 6))
    params = quant_params(rng, dtype)
    del params["yz"]
    assert_matches_ort("QLinearAveragePool", x, params, attributes, inputs=("x", "xs", "xz", "ys"))


SOFTMAXES = [
    ((3, 4, 10), 13, {}),
    ((3, 4, 10), 13, {"axis": 1}),
    ((2, 300, 2), 13, {}),
    ((3, 4, 10), 12, {}),  # axis -1 at every opset, as ORT's schema has it
    ((3, 4, 10), 12, {"axis": 1}),  # before 13: rows of 4 * 10
    ((4, 1000), 13, {}),
]


@DTYPES
@pytest.mark.parametrize("y_scale", [1 / 256, None], ids=["quantizer's", "random"])
@pytest.mark.parametrize(("shape", "opset", "attributes"), SOFTMAXES, ids=range(len(SOFTMAXES)))
def test_softmax_matches_ort(shape, opset, attributes, y_scale, dtype):
    rng = np.random.default_rng(opset + len(shape) + len(attributes))
    for _ in range(3):
        x = random_x(rng, dtype, shape)
        params = quant_params(rng, dtype, y_scale=y_scale)
        assert_matches_ort("QLinearSoftmax", x, params, {**attributes, "opset": opset}, opset=opset)


@DTYPES
def test_softmax_of_a_dominant_value_saturates_as_ort_does(dtype):
    info = np.iinfo(dtype)
    x = np.array([[info.max, info.min, info.min], [3, 3, 3]], dtype)
    params = {
        **quant_params(np.random.default_rng(0), dtype, y_scale=1 / 256),
        "xs": np.array(0.5, np.float32),
    }
    params["yz"] = np.array(info.min, dtype)
    assert_matches_ort("QLinearSoftmax", x, params, {"opset": 13}, opset=13)


@DTYPES
@pytest.mark.parametrize(
    ("axis", "shapes"), [(1, [(2, 3, 4), (2, 5, 4)]), (-1, [(3, 2), (3, 1), (3, 4)]), (0, [(1, 6), (2, 6)])]
)
def test_concat_matches_ort(axis, shapes, dtype):
    rng = np.random.default_rng(len(shapes) + axis)
    y = quant_params(rng, dtype)
    names, feeds, params = ["ys", "yz"], {}, {"ys": y["ys"], "yz": y["yz"]}
    for i, shape in enumerate(shapes):
        feeds[f"x{i}"] = random_x(rng, dtype, shape)
        # the first input already has Y's scale and zero point: ORT copies it
        own = y if i == 0 else quant_params(rng, dtype)
        params[f"s{i}"], params[f"z{i}"] = own["ys"], own["yz"]
        names += [f"x{i}", f"s{i}", f"z{i}"]
    model = contrib_model("QLinearConcat", names, feeds, params, {"axis": axis}, dtype)
    np.testing.assert_array_equal(run_flowrt(model, feeds), run_ort(model, feeds))


@DTYPES
@pytest.mark.parametrize("op", ["QLinearAdd", "QLinearMul"])
@pytest.mark.parametrize("omitted", [("cz",), ("az",), ("bz", "cz"), ("az", "bz", "cz")])
def test_binary_ops_take_omitted_zero_points_as_zero(op, omitted, dtype):
    rng = np.random.default_rng(len(omitted))
    a, b = random_x(rng, dtype, (2, 3, 4)), random_x(rng, dtype, (2, 3, 4))  # a B CpuAcc takes
    info = np.iinfo(dtype)
    given = {
        "as": np.array(0.05, np.float32),
        "bs": np.array(0.03, np.float32),
        "cs": np.array(0.1, np.float32),
    }
    for name in ("az", "bz", "cz"):
        given[name] = np.array(0 if name in omitted else rng.integers(info.min // 2, info.max // 2), dtype)
    names = ["a", "as", "az", "b", "bs", "bz", "cs", "cz"]
    feeds = {"a": a, "b": b}
    written_out = contrib_model(op, names, feeds, given, {}, dtype)
    kept = [n if n not in omitted else "" for n in names]
    while kept[-1] == "":  # a trailing zero point is left off the end
        kept.pop()
    model = contrib_model(op, kept, feeds, {n: v for n, v in given.items() if n not in omitted}, {}, dtype)
    got = run_flowrt(model, feeds)
    np.testing.assert_array_equal(got, run_flowrt(written_out, feeds))
    # CpuAcc declines a layer with a zero point left out: it runs on CpuRef, with the same values
    opt = flowrt.optimize(flowrt.onnx.load(model), backends=["CpuAcc", "CpuRef"])
    assert [opt.decisions[layer.name].backend for layer in opt.graph if layer.kind == op] == ["CpuRef"]
    np.testing.assert_array_equal(run_flowrt(model, feeds, ("CpuAcc", "CpuRef")), got)
    # ORT's shape inference refuses an empty name before C's scale: its answer is that of the
    # model with the zero points written out as 0. flowrt's QLinearAdd and QLinearMul are the
    # float DequantizeLinear -> op -> QuantizeLinear group; ORT's kernel rounds by its own path.
    want = run_ort(written_out, feeds)
    if omitted == ("cz",):
        np.testing.assert_array_equal(run_ort(model, feeds), want)
    assert np.abs(got.astype(int) - want.astype(int)).max() <= 1


def _optimize(op, inputs, feeds, params, attributes=None, out_type=np.uint8):
    model = contrib_model(op, inputs, feeds, params, attributes or {}, out_type)
    return flowrt.optimize(flowrt.onnx.load(model), backends=["CpuRef"])


U8 = {"xs": np.array(0.1, np.float32), "xz": np.array(3, np.uint8), "ys": np.array(0.2, np.float32)}


def test_a_zero_point_of_another_type_than_x_is_refused():
    params = {**U8, "yz": np.array(1, np.int8)}
    with pytest.raises(DataTypeError, match="Y_zero_point"):
        _optimize("QLinearSigmoid", ["x", "xs", "xz", "ys", "yz"], {"x": np.zeros((2, 2), np.uint8)}, params)


def test_a_float_input_is_refused_with_the_types_it_takes():
    with pytest.raises(
        DataTypeError, match="QLinearLeakyRelu input X expects one of int8, uint8, got float32"
    ):
        _optimize("QLinearLeakyRelu", ["x", "xs", "xz", "ys"], {"x": np.zeros((2, 2), np.float32)}, U8)


def test_a_pool_of_data_without_spatial_dims_is_refused():
    with pytest.raises(ShapeError, match="rank >= 3"):
        _optimize("QLinearGlobalAveragePool", ["x", "xs", "xz", "ys", "yz"],
                  {"x": np.zeros((2, 2), np.uint8)}, {**U8, "yz": np.array(0, np.uint8)})  # fmt: skip


def test_a_missing_output_scale_names_the_input():
    with pytest.raises(GraphError, match=r"input 3 \(Y_scale\)"):
        _optimize("QLinearAveragePool", ["x", "xs", "xz", ""], {"x": np.zeros((1, 1, 4, 4), np.uint8)},
              {"xs": U8["xs"], "xz": U8["xz"]}, {"kernel_shape": [2, 2]})  # fmt: skip


def test_concat_of_inputs_of_another_type_than_y_is_refused():
    params = {"ys": U8["ys"], "yz": np.array(0, np.int8), "s0": U8["xs"], "z0": U8["xz"]}
    with pytest.raises(DataTypeError, match="input 0 of Y's type int8 expected, got uint8"):
        _optimize("QLinearConcat", ["ys", "yz", "x0", "s0", "z0"], {"x0": np.zeros((2, 2), np.uint8)}, params,
              {"axis": 0}, np.int8)  # fmt: skip


class _Reader(CalibrationDataReader):
    """A few random images, as calibration data."""

    def __init__(self, rng, shape, count=8):
        self.batches = iter([{"x": rng.standard_normal(shape).astype(np.float32)} for _ in range(count)])

    def get_next(self):
        return next(self.batches, None)


def _float_classifier(rng):
    """x (1, 3, 16, 16) -> Conv -> Relu -> GlobalAveragePool -> Flatten -> Gemm -> y (1, 10):
    (nodes, initializers)."""
    inits = [
        numpy_helper.from_array(rng.standard_normal((8, 3, 3, 3)).astype(np.float32) * 0.3, "w"),
        numpy_helper.from_array(rng.standard_normal(8).astype(np.float32) * 0.1, "b"),
        numpy_helper.from_array(rng.standard_normal((10, 8)).astype(np.float32), "gw"),
        numpy_helper.from_array(rng.standard_normal(10).astype(np.float32), "gb"),
    ]
    nodes = [
        helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c"], ["r"]),
        helper.make_node("GlobalAveragePool", ["r"], ["g"]),
        helper.make_node("Flatten", ["g"], ["f"]),
        helper.make_node("Gemm", ["f", "gw", "gb"], ["y"], transB=1),
    ]
    return nodes, inits


def _float_pooling_net(rng):
    """x -> Conv -> LeakyRelu -> AveragePool -> Concat with its Sigmoid -> GlobalAveragePool ->
    Flatten -> Gemm -> Softmax -> y (1, 10): each op the quantizer writes as a com.microsoft op."""
    nodes, inits = _float_classifier(rng)
    inits[2] = numpy_helper.from_array(rng.standard_normal((10, 16)).astype(np.float32), "gw")
    nodes[1:3] = [
        helper.make_node("LeakyRelu", ["c"], ["r"], alpha=0.2),
        helper.make_node("AveragePool", ["r"], ["p"], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]),
        helper.make_node("Sigmoid", ["p"], ["s"]),
        helper.make_node("Concat", ["p", "s"], ["k"], axis=1),
        helper.make_node("GlobalAveragePool", ["k"], ["g"]),
    ]
    nodes[-1] = helper.make_node("Gemm", ["f", "gw", "gb"], ["z"], transB=1)
    nodes.append(helper.make_node("Softmax", ["z"], ["y"], axis=-1))
    return nodes, inits


FLOAT_MODELS = [
    (_float_classifier, {"QLinearGlobalAveragePool", "QGemm"}),
    (_float_pooling_net, {"QLinearLeakyRelu", "QLinearAveragePool", "QLinearSigmoid", "QLinearConcat",
                          "QLinearGlobalAveragePool", "QGemm", "QLinearSoftmax"}),
]  # fmt: skip


@pytest.mark.parametrize(("build", "contrib_ops"), FLOAT_MODELS, ids=["classifier", "pooling"])
@pytest.mark.parametrize("activation_type", [QuantType.QUInt8, QuantType.QInt8], ids=["uint8", "int8"])
def test_a_model_quantize_static_writes_as_qoperator_matches_ort_within_one_step(
    tmp_path, build, contrib_ops, activation_type
):
    rng = np.random.default_rng(0)
    nodes, inits = build(rng)
    graph = helper.make_graph(
        nodes, "float", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 16, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 10])], inits,
    )  # fmt: skip
    float_model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    float_model.ir_version = 8
    float_path, quant_path = tmp_path / "float.onnx", tmp_path / "int8.onnx"
    float_path.write_bytes(float_model.SerializeToString())
    quantize_static(
        str(float_path), str(quant_path), _Reader(rng, (1, 3, 16, 16)), quant_format=QuantFormat.QOperator,
        activation_type=activation_type, weight_type=QuantType.QInt8,
    )  # fmt: skip
    model = onnx.load(str(quant_path))
    assert {n.op_type for n in model.graph.node if n.domain == "com.microsoft"} == contrib_ops
    (step,) = [numpy_helper.to_array(i) for i in model.graph.initializer if i.name == "y_scale"]
    for _ in range(3):
        x = rng.standard_normal((1, 3, 16, 16)).astype(np.float32)
        got, want = run_flowrt(model, {"x": x}), run_ort(model, {"x": x})
        assert got.shape == want.shape
        np.testing.assert_allclose(got, want, rtol=0, atol=1.0001 * float(step))
