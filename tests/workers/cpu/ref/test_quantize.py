"""CpuRef QuantizeLinear, DequantizeLinear and DynamicQuantizeLinear against onnx's reference,
and their shape inference."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from oracle import assert_matches_reference, run_flowrt_node

from flowrt.engine.graph.layer_kind import get_layer_kind
from flowrt.engine.graph.layers.quantize import DequantizeLinearDescriptor, QuantizeLinearDescriptor
from flowrt.errors import DataTypeError, ShapeError
from flowrt.types import DataType, TensorInfo

QUANT_DTYPES = [np.uint8, np.int8, np.uint16, np.int16]
dims_strategy = st.lists(st.integers(1, 5), min_size=1, max_size=4)


def _params(rng, data, dims, dtype, mode):
    """(attributes, scale, zero point) for per-tensor, per-axis or blocked quantization."""
    axis = data.draw(st.integers(-len(dims), len(dims) - 1))
    if mode == "tensor":
        shape, attributes = (), {}
    elif mode == "axis":
        shape, attributes = (dims[axis],), {"axis": axis}
    else:
        block = data.draw(st.integers(1, 3))
        shape = tuple(-(-d // block) if i == axis % len(dims) else d for i, d in enumerate(dims))
        attributes = {"axis": axis, "block_size": block}
    scale = rng.uniform(0.01, 2.0, shape).astype(np.float32)
    info = np.iinfo(dtype)
    zero_point = rng.integers(max(info.min, -50), min(info.max, 50), shape, endpoint=True).astype(dtype)
    return attributes, scale, zero_point


@settings(max_examples=25, deadline=None)
@given(dims_strategy, st.sampled_from(QUANT_DTYPES), st.sampled_from(["tensor", "axis", "block"]), st.data())
def test_quantize_rounds_half_to_even_and_saturates_matches_reference(dims, dtype, mode, data):
    rng = np.random.default_rng(len(dims))
    attributes, scale, zero_point = _params(rng, data, dims, dtype, mode)
    x = rng.uniform(-300, 300, dims).astype(np.float32)
    x.flat[0] = 2.5 * scale.flat[0]  # an exact half
    (got,) = assert_matches_reference("QuantizeLinear", [x, scale, zero_point], attributes, opset=21)
    assert got.dtype == dtype


@settings(max_examples=25, deadline=None)
@given(dims_strategy, st.sampled_from(QUANT_DTYPES), st.sampled_from(["tensor", "axis", "block"]), st.data())
def test_dequantize_matches_reference(dims, dtype, mode, data):
    rng = np.random.default_rng(len(dims))
    attributes, scale, zero_point = _params(rng, data, dims, dtype, mode)
    info = np.iinfo(dtype)
    x = rng.integers(info.min, info.max, dims, endpoint=True).astype(dtype)
    with_zero_point = data.draw(st.booleans())
    inputs = [x, scale, zero_point] if with_zero_point else [x, scale]
    (got,) = assert_matches_reference("DequantizeLinear", inputs, attributes, opset=21)
    assert got.dtype == np.float32


def test_quantize_without_zero_point_gives_uint8_or_output_dtype():
    x = np.array([-1.0, 0.4, 0.5, 1.5, 400.0], dtype=np.float32)
    (got,) = assert_matches_reference("QuantizeLinear", [x, np.float32(1.0)], opset=13)
    np.testing.assert_array_equal(got, [0, 0, 0, 2, 255])
    (got,) = assert_matches_reference("QuantizeLinear", [x, np.float32(1.0)], {"output_dtype": 3}, opset=21)
    np.testing.assert_array_equal(got, [-1, 0, 0, 2, 127])


def test_dequantize_int32_and_float16_scale():
    x = np.array([-(2**31), 7, 2**31 - 1], dtype=np.int32)
    assert_matches_reference("DequantizeLinear", [x, np.float32(0.5)], opset=19)
    (got,) = assert_matches_reference("DequantizeLinear", [x[1:2], np.float16(0.25)], opset=19)
    assert got.dtype == np.float16


@settings(max_examples=25, deadline=None)
@given(dims_strategy, st.floats(-100, 100), st.floats(0, 100))
def test_dynamic_quantize_matches_reference(dims, low, span):
    x = np.random.default_rng(len(dims)).uniform(low, low + span, dims).astype(np.float32)
    y, scale, zero_point = assert_matches_reference("DynamicQuantizeLinear", [x], opset=11, num_outputs=3)
    assert y.dtype == np.uint8 and scale.shape == () and zero_point.dtype == np.uint8


@pytest.mark.parametrize("value", [1e-45, -1e-45, 3e-43])
def test_dynamic_quantize_of_a_subnormal_range_matches_the_reference(value):
    # (max - min) / 255 underflows to a zero scale (not for 3e-43): the zero point is then
    # 255, as min(255, NaN) gives in onnx's reference and in ONNX Runtime.
    x = np.array([value], np.float32)
    y, scale, zero_point = assert_matches_reference("DynamicQuantizeLinear", [x], opset=11, num_outputs=3)
    if scale == 0:
        assert zero_point == 255


def test_infer_copes_with_unknown_dims_and_ranks():
    quantize = get_layer_kind("QuantizeLinear").infer
    x = TensorInfo(("N", None, 4))
    zero_point = TensorInfo((None,), DataType.INT8)
    got = quantize(QuantizeLinearDescriptor(), [x, TensorInfo((None,)), zero_point], [None] * 3)[0]
    assert got == TensorInfo(("N", None, 4), DataType.INT8)
    dequantize = get_layer_kind("DequantizeLinear").infer
    x = TensorInfo(None, DataType.UINT8)
    got = dequantize(DequantizeLinearDescriptor(axis=2), [x, TensorInfo((3,)), None], [None] * 3)[0]
    assert got == TensorInfo(None, DataType.FLOAT32)


def test_bad_scales_and_types_raise():
    quantize = get_layer_kind("QuantizeLinear").infer
    x = TensorInfo((2, 3, 4))
    with pytest.raises(ShapeError, match=r"scale of shape \(\) or \(3,\) expected"):
        quantize(QuantizeLinearDescriptor(), [x, TensorInfo((4,))], [None, None])
    with pytest.raises(ShapeError, match=r"\(2, 3, 2\) expected"):
        quantize(QuantizeLinearDescriptor(axis=2, block_size=2), [x, TensorInfo((2, 3, 3))], [None, None])
    with pytest.raises(DataTypeError, match="got float32"):
        quantize(QuantizeLinearDescriptor(output_dtype=1), [x, TensorInfo(())], [None, None])
    with pytest.raises(DataTypeError, match="disagree"):
        zero_point = TensorInfo((), DataType.UINT8)
        quantize(QuantizeLinearDescriptor(output_dtype=3), [x, TensorInfo(()), zero_point], [None] * 3)
    dequantize = get_layer_kind("DequantizeLinear").infer
    with pytest.raises(DataTypeError, match="zero point of x's type int8"):
        args = [TensorInfo((2,), DataType.INT8), TensorInfo(()), TensorInfo((), DataType.UINT8)]
        dequantize(DequantizeLinearDescriptor(), args, [None] * 3)
    with pytest.raises(DataTypeError, match="got float8e8m0"):
        run_flowrt_node("QuantizeLinear", [np.ones(2, np.float32), np.float32(1)], {"output_dtype": 24})
