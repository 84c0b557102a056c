"""CpuRef elementwise kernels and their shape inference, checked against onnx's reference."""

from __future__ import annotations

import math

import numpy as np
import onnx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import array_shapes, mutually_broadcastable_shapes
from oracle import assert_matches_reference, run_flowrt_node

from flowrt.engine.graph.layer_kind import get_layer_kind
from flowrt.engine.graph.layers.elementwise import onnx_dtype_to_datatype
from flowrt.errors import DataTypeError, ShapeError, UnsupportedLayerError
from flowrt.frontends.onnx.descriptors import make_descriptor
from flowrt.types import DataType, TensorInfo
from flowrt.workers.cpu.ref.kernels.elementwise import erf

SHAPES = array_shapes(min_dims=0, max_dims=4, min_side=1, max_side=5)
SEEDS = st.integers(0, 2**31 - 1)

# Each unary float op with a sampler for its domain, so results are finite where ONNX's are.
UNARY_DOMAINS = {
    "Exp": (-5, 5), "Log": (0.01, 10), "Sqrt": (0, 10), "Neg": (-5, 5), "Abs": (-5, 5),
    "Reciprocal": (0.1, 5), "Floor": (-5, 5), "Ceil": (-5, 5), "Round": (-5, 5), "Sign": (-5, 5),
    "Erf": (-4, 4), "Sin": (-5, 5), "Cos": (-5, 5), "Tan": (-1.5, 1.5), "Asin": (-1, 1),
    "Acos": (-1, 1), "Atan": (-5, 5), "Sinh": (-5, 5), "Cosh": (-5, 5), "Asinh": (-5, 5),
    "Acosh": (1, 10), "Atanh": (-0.99, 0.99),
}  # fmt: skip


def infer(op_type, infos, attributes=None, consts=None, opset=21, num_outputs=1):
    """Run only the shape inference of ``op_type`` on ``infos``."""
    desc = make_descriptor(op_type, attributes or {}, opset=opset, num_outputs=num_outputs)
    return get_layer_kind(op_type).infer(desc, infos, consts or [None] * len(infos))


@pytest.mark.parametrize("op_type", sorted(UNARY_DOMAINS))
@settings(max_examples=25, deadline=None)
@given(shape=SHAPES, seed=SEEDS, dtype=st.sampled_from([np.float32, np.float64]))
def test_unary_math_matches_reference(op_type, shape, seed, dtype):
    low, high = UNARY_DOMAINS[op_type]
    x = np.random.default_rng(seed).uniform(low, high, shape).astype(dtype)
    assert_matches_reference(op_type, [x])


@pytest.mark.parametrize("op_type", ["Abs", "Neg", "Sign"])
def test_integer_unary_ops_keep_integer_dtype(op_type):
    x = np.array([[-7, 0, 3], [2, -1, 5]], dtype=np.int32)
    (y,) = assert_matches_reference(op_type, [x])
    assert y.dtype == np.int32


def test_float16_unary_stays_float16():
    x = np.linspace(-3, 3, 24, dtype=np.float16).reshape(2, 3, 4)
    (y,) = assert_matches_reference("Exp", [x], rtol=1e-3, atol=1e-3)
    assert y.dtype == np.float16


def test_erf_is_accurate_to_float64_precision_everywhere():
    x = np.concatenate([np.linspace(-7, 7, 20001), [1e-30, -1e-12, 2.4999, 2.5, -2.5001]])
    expected = np.array([math.erf(v) for v in x])
    np.testing.assert_allclose(erf(x), expected, rtol=1e-14, atol=1e-15)
    assert np.isnan(erf(np.array([np.nan])))[0]


def test_not_isnan_isinf_give_bool():
    flags = np.array([[True, False], [False, True]])
    assert_matches_reference("Not", [flags])
    x = np.array([1.0, np.nan, np.inf, -np.inf, -2.0], dtype=np.float32)
    (nan,) = assert_matches_reference("IsNaN", [x])
    assert nan.tolist() == [False, True, False, False, False]
    for neg in (0, 1):
        for pos in (0, 1):
            assert_matches_reference("IsInf", [x], {"detect_negative": neg, "detect_positive": pos})


BINARY_NUMERIC = ["Add", "Sub", "Mul", "Div", "Pow", "Max", "Min", "Sum", "Mean"]
COMPARISONS = ["Equal", "Less", "Greater", "LessOrEqual", "GreaterOrEqual"]


@pytest.mark.parametrize("op_type", BINARY_NUMERIC + COMPARISONS)
@settings(max_examples=25, deadline=None)
@given(shapes=mutually_broadcastable_shapes(num_shapes=2, max_dims=4, max_side=4), seed=SEEDS)
def test_binary_ops_broadcast_like_reference(op_type, shapes, seed):
    rng = np.random.default_rng(seed)
    # onnx's reference Mean accumulates in place into its first input, so give that one the full shape.
    a_shape = shapes.result_shape if op_type == "Mean" else shapes.input_shapes[0]
    a = rng.uniform(0.5, 3, a_shape).astype(np.float32)
    b = rng.choice([0.5, 1.0, 2.0, 3.0], shapes.input_shapes[1]).astype(np.float32)
    (y,) = assert_matches_reference(op_type, [a, b], rtol=1e-5)
    assert y.shape == shapes.result_shape


@pytest.mark.parametrize("op_type", ["Max", "Min", "Sum", "Mean"])
@settings(max_examples=25, deadline=None)
@given(
    shapes=mutually_broadcastable_shapes(num_shapes=4, max_dims=3, max_side=4),
    count=st.integers(1, 4),
    seed=SEEDS,
)
def test_variadic_ops_take_any_number_of_inputs(op_type, shapes, count, seed):
    rng = np.random.default_rng(seed)
    input_shapes = list(shapes.input_shapes[:count])
    if op_type == "Mean":  # onnx's reference Mean accumulates in place into its first input
        input_shapes[0] = np.broadcast_shapes(*input_shapes)
    inputs = [rng.standard_normal(s).astype(np.float32) for s in input_shapes]
    assert_matches_reference(op_type, inputs)


def test_integer_division_truncates_toward_zero():
    a = np.array([7, -7, 7, -7, 6, 0], dtype=np.int32)
    b = np.array([2, 2, -2, -2, 3, 5], dtype=np.int32)
    (y,) = assert_matches_reference("Div", [a, b])
    assert y.tolist() == [3, -3, -3, 3, 2, 0]


def test_integer_mean_and_sum_keep_dtype():
    a, b = np.array([1, 2, 7], dtype=np.int64), np.array([2, 2, 0], dtype=np.int64)
    assert_matches_reference("Sum", [a, b])
    (mean,) = assert_matches_reference("Mean", [a, b])
    assert mean.dtype == np.int64


@pytest.mark.parametrize("fmod", [0, 1])
@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.float32])
def test_mod_takes_sign_of_divisor_or_dividend(fmod, dtype):
    a = np.array([-4, 7, 5, -9, 3], dtype=dtype)
    b = np.array([3, -3, 2, 4, -8], dtype=dtype)
    (y,) = assert_matches_reference("Mod", [a, b], {"fmod": fmod})
    expected = np.fmod(a, b) if fmod else np.mod(a, b)
    np.testing.assert_array_equal(y, expected)


def test_pow_keeps_the_base_dtype_for_any_exponent_dtype():
    base = np.array([[1.5, 2.0], [3.0, 0.5]], dtype=np.float32)
    (y,) = assert_matches_reference("Pow", [base, np.array([2, 3], dtype=np.int64)])
    assert y.dtype == np.float32
    assert (
        infer("Pow", [TensorInfo((2, 2), DataType.INT32), TensorInfo((2,), DataType.FLOAT32)])[0].dtype
        == DataType.INT32
    )


@pytest.mark.parametrize("direction", ["LEFT", "RIGHT"])
@pytest.mark.parametrize("dtype", [np.uint8, np.uint32, np.uint64])
def test_bitshift_matches_reference(direction, dtype):
    x = np.array([1, 4, 255, 16, 7], dtype=dtype)
    y = np.array([1, 2, 3, 0, 4], dtype=dtype)
    assert_matches_reference("BitShift", [x, y], {"direction": direction})


def test_bitshift_beyond_the_bit_width_gives_zero_or_sign_fill():
    x = np.array([-8, 8, -8, 8], dtype=np.int8)
    shift = np.array([9, 9, 1, 1], dtype=np.int8)
    (right,), _ = run_flowrt_node("BitShift", [x, shift], {"direction": "RIGHT"})
    assert right.tolist() == [-1, 0, -4, 4]
    (left,), _ = run_flowrt_node(
        "BitShift", [np.array([64, 1], np.int8), np.array([1, 8], np.int8)], {"direction": "LEFT"}
    )
    assert left.tolist() == [-128, 0]


@pytest.mark.parametrize("op_type", ["And", "Or", "Xor"])
def test_logical_ops_broadcast_bools(op_type):
    a = np.array([[True, False, True]])
    b = np.array([[True], [False]])
    assert_matches_reference(op_type, [a, b])


@pytest.mark.parametrize("dtype", [np.int64, np.bool_, np.float64])
def test_comparisons_give_bool_for_every_input_dtype(dtype):
    a = np.array([[0, 1, 2]], dtype=dtype)
    b = np.array([[1], [0]], dtype=dtype)
    (y,) = assert_matches_reference("Equal", [a, b])
    assert y.dtype == np.bool_ and y.shape == (2, 3)


@settings(max_examples=25, deadline=None)
@given(shapes=mutually_broadcastable_shapes(num_shapes=3, max_dims=4, max_side=4), seed=SEEDS)
def test_where_broadcasts_three_inputs(shapes, seed):
    rng = np.random.default_rng(seed)
    cond_shape, x_shape, y_shape = shapes.input_shapes
    condition = rng.random(cond_shape) > 0.5
    x, y = rng.standard_normal(x_shape).astype(np.float32), rng.standard_normal(y_shape).astype(np.float32)
    assert_matches_reference("Where", [condition, x, y])


CAST_DTYPES = [np.float32, np.float64, np.float16, np.int8, np.uint8, np.int32, np.int64, np.uint16, np.bool_]


@settings(max_examples=25, deadline=None)
@given(source=st.sampled_from(CAST_DTYPES), target=st.sampled_from(CAST_DTYPES), shape=SHAPES, seed=SEEDS)
def test_cast_and_castlike_match_reference(source, target, shape, seed):
    x = (np.random.default_rng(seed).uniform(0, 100, shape)).astype(source)
    to = onnx.helper.np_dtype_to_tensor_dtype(np.dtype(target))
    (y,) = assert_matches_reference("Cast", [x], {"to": to})
    assert y.dtype == target
    assert_matches_reference("CastLike", [x, np.zeros((1,), dtype=target)])


def test_cast_before_opset_6_names_the_target_type():
    x = np.array([1.7, -2.2], dtype=np.float32)
    (y,), (info,) = run_flowrt_node("Cast", [x], {"to": "INT32"}, opset=5)
    assert y.dtype == np.int32 and y.tolist() == [1, -2] and info.dtype == DataType.INT32


@pytest.mark.parametrize("to", [8, 14])  # string, complex64
def test_cast_to_unsupported_types_raises_data_type_error(to):
    with pytest.raises(DataTypeError, match="not supported|no flowrt DataType"):
        infer("Cast", [TensorInfo((2,), DataType.FLOAT32)], {"to": to})


def test_onnx_dtype_codes_map_like_onnx():
    for code in (1, 2, 3, 4, 5, 6, 7, 9, 10, 11, 12, 13, *range(16, 29)):
        expected = onnx.helper.tensor_dtype_to_np_dtype(code)
        assert onnx_dtype_to_datatype(code).numpy == expected
    assert onnx_dtype_to_datatype(8) == DataType.STRING and onnx_dtype_to_datatype(16) == DataType.BFLOAT16
    with pytest.raises(DataTypeError, match="COMPLEX64"):
        onnx_dtype_to_datatype(14)


def test_identity_passes_any_tensor_through():
    x = np.arange(6, dtype=np.int64).reshape(2, 3)
    assert_matches_reference("Identity", [x])


@pytest.mark.parametrize("opset, mask_dtype", [(7, np.float32), (13, np.bool_)])
def test_dropout_is_identity_at_inference_with_an_all_kept_mask(opset, mask_dtype):
    x = np.random.default_rng(0).standard_normal((2, 3)).astype(np.float32)
    (y, mask), (_, mask_info) = run_flowrt_node(
        "Dropout", [x], {"ratio": 0.3} if opset < 12 else {}, opset=opset, num_outputs=2
    )
    np.testing.assert_array_equal(y, x)
    assert mask.dtype == mask_dtype and mask.all() and mask_info.dtype.numpy == mask_dtype
    assert_matches_reference("Dropout", [x], opset=13)


def test_dropout_in_training_mode_is_refused_unless_nothing_drops():
    x = np.ones((2, 2), dtype=np.float32)
    with pytest.raises(UnsupportedLayerError, match="training_mode"):
        run_flowrt_node("Dropout", [x, np.array(0.5, np.float32), np.array(True)])
    (y,), _ = run_flowrt_node("Dropout", [x, np.array(0.0, np.float32), np.array(True)])
    np.testing.assert_array_equal(y, x)


def test_legacy_broadcast_aligns_b_with_a_from_axis():
    a = np.zeros((2, 3, 4, 5), dtype=np.float32)
    b = np.arange(12, dtype=np.float32).reshape(3, 4)
    (y,), (info,) = run_flowrt_node("Add", [a, b], {"broadcast": 1, "axis": 1}, opset=6)
    np.testing.assert_array_equal(y, np.broadcast_to(b[None, :, :, None], a.shape))
    assert info.shape == (2, 3, 4, 5)
    suffix = np.arange(5, dtype=np.float32)
    (y,), _ = run_flowrt_node("Mul", [np.ones((2, 5), np.float32), suffix], {"broadcast": 1}, opset=6)
    np.testing.assert_array_equal(y, np.broadcast_to(suffix, (2, 5)))


def test_legacy_binary_without_broadcast_requires_equal_shapes():
    a, b = TensorInfo((2, 3)), TensorInfo((3,))
    with pytest.raises(ShapeError, match="broadcast=1"):
        infer("Sub", [a, b], opset=6)
    with pytest.raises(ShapeError, match="does not match"):
        infer("Add", [TensorInfo((2, 3, 4)), TensorInfo((4,))], {"broadcast": 1, "axis": 1}, opset=1)


def test_incompatible_broadcast_raises_shape_error():
    with pytest.raises(ShapeError, match="cannot be broadcast"):
        infer("Add", [TensorInfo((2, 3)), TensorInfo((4,))])
    with pytest.raises(ShapeError, match="cannot be broadcast"):
        infer("Max", [TensorInfo((2, 3)), TensorInfo((3,)), TensorInfo((2, 1, 5))])


def test_mismatched_dtypes_raise_data_type_error():
    with pytest.raises(DataTypeError, match="one data type"):
        infer("Mul", [TensorInfo((2,), DataType.FLOAT32), TensorInfo((2,), DataType.INT64)])
    with pytest.raises(DataTypeError, match="bool"):
        infer("Where", [TensorInfo((2,), DataType.FLOAT32), TensorInfo((2,)), TensorInfo((2,))])
    with pytest.raises(DataTypeError, match="expects one of"):
        infer("Exp", [TensorInfo((2,), DataType.INT32)])


def test_infer_copes_with_unknown_and_symbolic_dims():
    (y,) = infer("Add", [TensorInfo(("N", 3, None)), TensorInfo((1, None, 4))])
    assert y.shape == ("N", 3, 4)
    (y,) = infer("Less", [TensorInfo(None), TensorInfo((3,))])
    assert y.shape is None and y.dtype == DataType.BOOL
    (y,) = infer("Add", [TensorInfo(None), TensorInfo((3,))], {"broadcast": 1}, opset=6)
    assert y.shape is None
    (y,) = infer("Where", [TensorInfo((1, 1), DataType.BOOL), TensorInfo(("B", 5)), TensorInfo((None,))])
    assert y.shape == ("B", 5)
    (y, mask) = infer("Dropout", [TensorInfo(("N", None))], num_outputs=2)
    assert mask.shape == ("N", None) and mask.dtype == DataType.BOOL
    (y,) = infer("Cast", [TensorInfo(None)], {"to": 7})
    assert y.shape is None and y.dtype == DataType.INT64
