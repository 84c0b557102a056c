"""CpuRef BitCast against onnx's reference, its errors, and through the public API."""

import numpy as np
import pytest
from onnx import TensorProto, helper
from oracle import assert_matches_reference, run_flowrt_node

import flowrt
from flowrt.engine.graph.layer_kind import get_layer_kind
from flowrt.engine.graph.layers.bitcast import BitCastDescriptor
from flowrt.errors import DataTypeError, ModelLoadError
from flowrt.frontends.onnx.descriptors import make_descriptor
from flowrt.types import DataType, TensorInfo

_SAME_WIDTH = [
    (np.float32, TensorProto.INT32), (np.int32, TensorProto.UINT32), (np.float64, TensorProto.INT64),
    (np.uint64, TensorProto.DOUBLE), (np.float16, TensorProto.INT16), (np.uint16, TensorProto.FLOAT16),
    (np.int8, TensorProto.UINT8), (np.bool_, TensorProto.INT8),
]  # fmt: skip


@pytest.mark.parametrize("source, to", _SAME_WIDTH)
@pytest.mark.parametrize("shape", [(), (5,), (2, 3)])
def test_bitcast_matches_reference(source, to, shape):
    rng = np.random.default_rng(len(shape))
    x = (rng.standard_normal(shape) * 100).astype(source)
    (y,) = assert_matches_reference("BitCast", [x], {"to": to}, opset=26, rtol=0, atol=0)
    assert y.tobytes() == x.tobytes()


def test_bitcast_of_one_float_gives_its_ieee_bits():
    (y,), (info,) = run_flowrt_node(
        "BitCast", [np.array([1.0, -2.0], np.float32)], {"to": TensorProto.INT32}, opset=26
    )
    np.testing.assert_array_equal(y, [0x3F800000, -0x40000000])
    assert info.dtype is DataType.INT32


@pytest.mark.parametrize(
    "dtype, to, message",
    [
        (DataType.FLOAT32, TensorProto.DOUBLE, "as wide as the input expected: float32 is 32 bits, float64 64"),
        (DataType.INT8, TensorProto.INT16, "int8 is 8 bits, int16 16"),
        (DataType.FLOAT32, TensorProto.STRING, "target 'to' type string cannot be bit-cast"),
        (DataType.UINT8, TensorProto.INT4, "uint8 is 8 bits, int4 4"),
        (DataType.FLOAT32, TensorProto.COMPLEX64, r"ONNX data type 14 \(COMPLEX64\) has no flowrt DataType"),
    ],
)  # fmt: skip
def test_bitcast_to_a_type_of_another_width_or_unsupported_says_so(dtype, to, message):
    with pytest.raises(DataTypeError, match=message):
        get_layer_kind("BitCast").infer(BitCastDescriptor(to=to), [TensorInfo((3,), dtype)], [None])


def test_bitcast_without_to_fails_at_load():
    with pytest.raises(ModelLoadError, match="invalid attributes for BitCast"):
        make_descriptor("BitCast", {}, opset=26, num_outputs=1, where="node 'cast'")


def test_bitcast_runs_through_the_public_api():
    node = helper.make_node("BitCast", ["x"], ["y"], to=TensorProto.UINT32)
    graph = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, (2, 2))],
        [helper.make_tensor_value_info("y", TensorProto.UINT32, (2, 2))],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 26)])
    model.ir_version = 10
    x = np.array([[0.5, -0.0], [np.inf, 3.25]], np.float32)
    (y,) = flowrt.InferenceSession(model, backends=["CpuRef"]).run(None, {"x": x})
    np.testing.assert_array_equal(y, x.view(np.uint32))
