"""CpuRef Gemm, MatMul, MatMulInteger and QLinearMatMul against onnx's reference, and their shape inference."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from oracle import assert_matches_reference, run_flowrt_node

from flowrt.engine.graph.layer_kind import get_layer_kind
from flowrt.errors import DataTypeError, ShapeError
from flowrt.frontends.onnx.descriptors import make_descriptor
from flowrt.types import DataType, TensorInfo

RNG = np.random.default_rng(5)


def _normal(*shape, dtype=np.float32):
    return RNG.standard_normal(shape).astype(dtype)


@settings(max_examples=25, deadline=None)
@given(
    st.integers(1, 5),
    st.integers(1, 5),
    st.integers(1, 5),
    st.integers(0, 1),
    st.integers(0, 1),
    st.sampled_from([1.0, 0.5, -2.0]),
    st.sampled_from([1.0, 0.0, 3.0]),
    st.sampled_from(["absent", "scalar", "N", "1N", "M1", "MN"]),
)
def test_gemm_with_transposes_scales_and_broadcast_c_matches_reference(
    m, k, n, trans_a, trans_b, alpha, beta, c_form
):
    a = _normal(*((k, m) if trans_a else (m, k)))
    b = _normal(*((n, k) if trans_b else (k, n)))
    c_shapes = {"scalar": (), "N": (n,), "1N": (1, n), "M1": (m, 1), "MN": (m, n)}
    inputs = [a, b] + ([] if c_form == "absent" else [_normal(*c_shapes[c_form])])
    attributes = {"alpha": alpha, "beta": beta, "transA": trans_a, "transB": trans_b}
    assert_matches_reference("Gemm", inputs, attributes, opset=13)


@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.float64])
def test_gemm_keeps_integer_and_double_types(dtype):
    a, b, c = (RNG.integers(-5, 5, shape).astype(dtype) for shape in ((3, 4), (4, 2), (2,)))
    got = assert_matches_reference("Gemm", [a, b, c], {"transA": 0}, opset=13)
    assert got[0].dtype == dtype


def test_legacy_gemm_broadcasts_c_only_when_asked():
    a, b = _normal(3, 4), _normal(4, 2)
    assert_matches_reference("Gemm", [a, b, _normal(2)], {"broadcast": 1, "beta": 0.5}, opset=6)
    assert_matches_reference("Gemm", [a, b, _normal(3, 2)], {"broadcast": 0}, opset=6)
    with pytest.raises(ShapeError, match="broadcast=0"):
        _infer("Gemm", [(3, 4), (4, 2), (2,)], opset=6)
    assert _infer("Gemm", [(3, 4), (4, 2), (2,)], opset=7).shape == (3, 2)


@st.composite
def matmul_shapes(draw):
    """Operand shapes numpy's matmul accepts: 1-D operands, and batch dims that broadcast."""
    m, k, n = draw(st.integers(1, 4)), draw(st.integers(1, 4)), draw(st.integers(1, 4))
    batch = draw(st.lists(st.integers(1, 3), max_size=2))
    a_batch = [d if draw(st.booleans()) else 1 for d in batch][draw(st.integers(0, len(batch))) :]
    b_batch = [d if draw(st.booleans()) else 1 for d in batch][draw(st.integers(0, len(batch))) :]
    a = [k] if draw(st.booleans()) else [*a_batch, m, k]
    b = [k] if draw(st.booleans()) else [*b_batch, k, n]
    return a, b


@settings(max_examples=25, deadline=None)
@given(matmul_shapes(), st.sampled_from([np.float32, np.int64]))
def test_matmul_broadcasts_batches_and_1d_operands_like_numpy(shapes, dtype):
    a, b = (RNG.integers(-4, 4, s).astype(dtype) for s in shapes)
    got = assert_matches_reference("MatMul", [a, b])
    assert got[0].shape == np.matmul(a, b).shape


def test_matmul_integer_subtracts_zero_points():
    a = RNG.integers(0, 255, (2, 3, 4), endpoint=True).astype(np.uint8)
    b = RNG.integers(-128, 127, (4, 5), endpoint=True).astype(np.int8)
    got = assert_matches_reference("MatMulInteger", [a, b, np.uint8(12), np.arange(5, dtype=np.int8)])
    assert got[0].dtype == np.int32


def test_matmul_integer_per_row_zero_point_belongs_to_the_rows_of_a():
    # onnx's reference subtracts an M-vector along K, so compare with numpy directly.
    a = RNG.integers(0, 255, (3, 4), endpoint=True).astype(np.uint8)
    b = RNG.integers(0, 255, (4, 2), endpoint=True).astype(np.uint8)
    a_zero_point = np.array([1, 2, 3], dtype=np.uint8)
    (got,), infos = run_flowrt_node("MatMulInteger", [a, b, a_zero_point])
    expected = (a.astype(np.int32) - a_zero_point.astype(np.int32)[:, None]) @ b.astype(np.int32)
    np.testing.assert_array_equal(got, expected)
    assert infos[0].dtype == DataType.INT32 and infos[0].shape == (3, 2)


@pytest.mark.parametrize("dtype", [np.uint8, np.int8])
def test_qlinear_matmul_requantizes_with_rounding_and_saturation(dtype):
    info, rng = np.iinfo(dtype), np.random.default_rng(11)
    a, b = (rng.integers(info.min, info.max, s, endpoint=True).astype(dtype) for s in ((2, 4, 3), (3, 5)))
    scale, zero = np.float32(0.05), dtype(3)
    inputs = [a, np.float32(0.02), zero, b, np.float32(0.03), zero, scale, dtype(info.max // 2)]
    got = assert_matches_reference("QLinearMatMul", inputs)
    assert got[0].dtype == dtype
    assert (got[0] == info.max).any() or (got[0] == info.min).any(), "the case should saturate"


def _infer(op, shapes, dtype=DataType.FLOAT32, opset=21, **attributes):
    desc = make_descriptor(op, attributes, opset=opset, num_outputs=1)
    infos = [TensorInfo(s, dtype) for s in shapes]
    return get_layer_kind(op).infer(desc, infos, [None] * len(infos))[0]


def test_infer_copes_with_unknown_and_symbolic_dims():
    assert _infer("Gemm", [("M", None), (None, 7)], transA=1).shape == (None, 7)
    assert _infer("Gemm", [None, None]).shape == (None, None)
    assert _infer("MatMul", [("B", "S", 64), (64, 32)]).shape == ("B", "S", 32)
    assert _infer("MatMul", [(None, 3, 4), (2, 1, 4, 5)]).shape == (2, None, 3, 5)
    assert _infer("MatMul", [(4,), ("B", 4, 6)]).shape == ("B", 6)
    assert _infer("MatMul", [None, (4, 6)]).shape is None


def test_infer_rejects_mismatched_inner_dims_ranks_and_types():
    with pytest.raises(ShapeError, match="share K"):
        _infer("Gemm", [(3, 4), (5, 2)])
    with pytest.raises(ShapeError, match="share K"):
        _infer("Gemm", [(3, 4), (2, 4)], transA=1, transB=1)
    with pytest.raises(ShapeError, match="rank 2"):
        _infer("Gemm", [(2, 3, 4), (4, 2)])
    with pytest.raises(ShapeError, match="broadcasts to"):
        _infer("Gemm", [(3, 4), (4, 2), (3,)])
    with pytest.raises(ShapeError, match="row count"):
        _infer("MatMul", [(2, 3, 4), (5, 6)])
    with pytest.raises(ShapeError, match="cannot be broadcast"):
        _infer("MatMul", [(2, 3, 4), (3, 4, 6)])
    with pytest.raises(ShapeError, match="rank >= 1"):
        _infer("MatMul", [(), (3,)])
    with pytest.raises(DataTypeError, match="one data type"):
        get_layer_kind("MatMul").infer(
            None, [TensorInfo((2, 2)), TensorInfo((2, 2), DataType.FLOAT64)], [None, None]
        )
    with pytest.raises(DataTypeError, match="int8 or uint8"):
        _infer("MatMulInteger", [(2, 2), (2, 2)])
