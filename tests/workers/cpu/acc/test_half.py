"""CpuAcc's weights kept as float16 and computed in float32 (``half.py``): the conversions, and
each product that reads them (packed panels, rows for matrix-vector products) against the
same product in float64 of the rounded weights."""

import numpy as np
import pytest
from numba import njit

from flowrt.descriptors import Conv as ConvDescriptor
from flowrt.descriptors import Gemm
from flowrt.registry import WorkloadInfo
from flowrt.types import DataType, TensorInfo
from flowrt.workers.cpu.acc import gemv, packed_gemm
from flowrt.workers.cpu.acc.conv.geometry import ConvGeometry
from flowrt.workers.cpu.acc.conv.tuning import ConvTuning
from flowrt.workers.cpu.acc.half import HALF_BITS, from_half, is_half, to_half, widen
from flowrt.workers.cpu.acc.kernels.conv import ConvKernel
from flowrt.workers.cpu.acc.kernels.gemm import GemmKernel, MatMulKernel
from flowrt.workers.cpu.acc.tile_ir import TILE_COLUMNS, TILE_ROWS


def test_to_half_rounds_to_float16_and_keeps_its_bits_read_only():
    values = np.array([[1.0, -2.5, 1e-8, 70000.0], [0.1, np.nan, -0.0, 3.14159]], np.float32)
    bits = to_half(values)
    assert bits.dtype == HALF_BITS and bits.shape == values.shape and not bits.flags.writeable
    assert is_half(bits) and not is_half(values)
    back = from_half(bits)
    with np.errstate(over="ignore"):
        np.testing.assert_array_equal(back, values.astype(np.float16).astype(np.float32))
    assert back[0, 3] == np.inf and np.isnan(back[1, 1]) and np.signbit(back[1, 2])


@njit(cache=False)
def _sum_widened(values):
    total = np.float32(0)
    for i in range(values.shape[0]):
        total += widen(values[i])
    return total


def test_widen_reads_float32_as_it_is_and_float16_bits_as_their_value():
    values = np.linspace(-1, 3, 37, dtype=np.float32) + np.float32(0.01)
    assert _sum_widened(values) == pytest.approx(float(values.sum()), rel=1e-6)
    rounded = from_half(to_half(values))
    assert _sum_widened(to_half(values)) == pytest.approx(float(rounded.astype(np.float64).sum()), rel=1e-6)


def _product(a, w, bias):
    return a.astype(np.float64) @ w.astype(np.float64) + bias


@pytest.mark.skipif(not packed_gemm.AVAILABLE, reason="no register tiles on this CPU")
@pytest.mark.parametrize("workers", [1, 2])
@pytest.mark.parametrize(
    "m, k, n",
    [
        (TILE_ROWS * 3, 64, TILE_COLUMNS * 2),  # whole tiles
        (TILE_ROWS * 2 + 3, 300, TILE_COLUMNS + 5),  # a tail of rows, a partial last panel
        (5, 600, 7),  # past DEPTH: blocks of k summed onto the output
    ],
)
def test_packed_products_read_half_panels(m, k, n, workers):
    rng = np.random.default_rng(m + k + n)
    a = rng.standard_normal((m, k), dtype=np.float32)
    w = rng.standard_normal((k, n), dtype=np.float32) / np.float32(np.sqrt(k))
    bias = rng.standard_normal(n, dtype=np.float32)
    weights = packed_gemm.pack(w, bias, half=True)
    assert weights.panels.dtype == HALF_BITS
    assert weights.panels.nbytes == packed_gemm.pack(w, bias).panels.nbytes // 2
    c = np.full((m, n), np.nan, np.float32)
    packed_gemm.multiply(a, weights, c, packed_gemm.plan(m, weights, workers), 0, 0.0, 0.0)
    want = _product(a, from_half(to_half(w)), bias)
    np.testing.assert_allclose(c, want, rtol=1e-5, atol=2e-6 * np.abs(want).max())


@pytest.mark.parametrize("images, k, n", [(1, 100, 37), (3, 1024, 64)])
def test_matrix_vector_products_read_half_rows(images, k, n):
    rng = np.random.default_rng(k)
    x = rng.standard_normal((images, k), dtype=np.float32)
    w = rng.standard_normal((n, k), dtype=np.float32) / np.float32(np.sqrt(k))
    bias = rng.standard_normal(n, dtype=np.float32)
    out = np.full((images, n), np.nan, np.float32)
    gemv.gemv(to_half(w), x, bias, out, gemv.row_bounds(n, k, 2), 0, np.float32(0), np.float32(0))
    want = _product(x, from_half(to_half(w)).T, bias)
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=2e-6 * np.abs(want).max())


@pytest.mark.skipif(not packed_gemm.AVAILABLE, reason="no register tiles on this CPU")
def test_a_gemm_by_rows_reads_its_transposed_constant_in_place_rather_than_a_half_copy():
    # B (N, K) with transB is already the rows a matrix-vector product reads: a float16 copy
    # would add half its bytes, not save them
    rng = np.random.default_rng(3)
    a = rng.standard_normal((1, 64), dtype=np.float32)
    b = rng.standard_normal((40, 64), dtype=np.float32)
    kernel = GemmKernel(_info("Gemm", Gemm(transB=1), a.shape, b, None, True), workers=1)
    (y,) = kernel.execute([a, b])
    rows = kernel.packed._by_rows()[0]
    assert rows.dtype == np.float32 and np.shares_memory(rows, b)
    np.testing.assert_allclose(y, a @ b.T, rtol=1e-5, atol=1e-5)


def _info(kind, descriptor, a_shape, w, bias, fp16):
    f32 = DataType.FLOAT32
    inputs = [TensorInfo(a_shape, f32), TensorInfo(w.shape, f32)] + (
        [TensorInfo(bias.shape, f32)] if bias is not None else []
    )
    n = w.shape[0] if getattr(descriptor, "transB", 0) else w.shape[1]
    return WorkloadInfo(
        "layer", kind, descriptor, tuple(inputs), (TensorInfo((*a_shape[:-1], n), f32),),
        (None, w, bias) if bias is not None else (None, w), fp16_weights=fp16,
    )  # fmt: skip


@pytest.mark.skipif(not packed_gemm.AVAILABLE, reason="no register tiles on this CPU")
@pytest.mark.parametrize("rows", [2, 40])  # by rows (gemv), by panels
@pytest.mark.parametrize("kind", ["Gemm", "MatMulBias"])
def test_gemm_and_matmul_layers_keep_half_weights_when_asked(kind, rows):
    rng = np.random.default_rng(rows)
    a = rng.standard_normal((rows, 96), dtype=np.float32)
    w = rng.standard_normal((96, 50), dtype=np.float32) / np.float32(10)
    bias = rng.standard_normal(50, dtype=np.float32)
    results = {}
    for fp16 in (False, True):
        if kind == "Gemm":
            kernel = GemmKernel(_info("Gemm", Gemm(), a.shape, w, bias, fp16), workers=2)
        else:
            kernel = MatMulKernel(_info("MatMulBias", None, a.shape, w, bias, fp16), workers=2)
        (results[fp16],) = kernel.execute([a, w, bias])
        assert kernel.packed.half is fp16
        form = kernel.packed.weights.panels if rows > gemv.MAX_VECTORS else kernel.packed._by_rows()[0]
        assert form.dtype == (HALF_BITS if fp16 else np.float32)
    want = _product(a, w, bias)
    np.testing.assert_allclose(results[False], want, rtol=1e-5, atol=1e-5)
    # float16 weights: each rounded to 11 bits, so within about 1e-3 of the float32 result
    np.testing.assert_allclose(results[True], want, rtol=0, atol=2e-3 * np.abs(want).max())
    assert not np.array_equal(results[True], results[False])


def _conv_info(x_shape, w, fp16, **attrs_):
    f32 = DataType.FLOAT32
    desc = ConvDescriptor(**attrs_)
    out = ConvGeometry.of(desc, x_shape, w.shape, 1).out_shape
    return WorkloadInfo(
        "conv", "Conv", desc, (TensorInfo(x_shape, f32), TensorInfo(w.shape, f32)), (TensorInfo(out, f32),),
        (None, w), fp16_weights=fp16,
    )  # fmt: skip


P1 = (1, 1, 1, 1)


@pytest.mark.skipif(not packed_gemm.AVAILABLE, reason="no register tiles on this CPU")
@pytest.mark.parametrize(
    "x_shape, w_shape, attrs_, fast_math, algorithm, half_form",
    [
        ((1, 64, 14, 14), (64, 64, 3, 3), dict(pads=P1), False, "winograd", "_winograd_panels"),
        # F(4x4, 3x3) (fast math) keeps float32 panels: its transforms would add 5e-3 errors
        ((2, 32, 28, 28), (32, 32, 3, 3), dict(pads=P1), True, "winograd", None),
        ((1, 64, 14, 14), (128, 64, 1, 1), {}, False, "packed", "_panels"),
        ((1, 40, 10, 10), (8, 20, 3, 3), dict(group=2, pads=P1), False, "columns", "_panels"),
        ((1, 3, 64, 64), (16, 3, 7, 7), dict(strides=(2, 2), pads=(3, 3, 3, 3)), False, "windows", "_panels"),
        ((4, 512, 7, 7), (512, 512, 1, 1), {}, False, "few_pixels", "_columns"),
        ((1, 8, 16, 16), (16, 8, 3, 3), dict(pads=P1), False, "taps", None),  # BLAS: float32
        ((1, 32, 14, 14), (32, 1, 3, 3), dict(group=32, pads=P1), False, "depthwise_vector", None),
    ],
)
def test_convs_read_half_panels_where_their_tiles_read_panels(
    x_shape, w_shape, attrs_, fast_math, algorithm, half_form
):
    rng = np.random.default_rng(sum(w_shape))
    x = rng.standard_normal(x_shape, dtype=np.float32)
    w = rng.standard_normal(w_shape, dtype=np.float32) / np.float32(np.sqrt(np.prod(w_shape[1:])))
    tuning = ConvTuning(fast_math=fast_math)
    full = ConvKernel(_conv_info(x_shape, w, False, **attrs_), workers=2, tuning=tuning)
    half = ConvKernel(_conv_info(x_shape, w, True, **attrs_), workers=2, tuning=tuning)
    assert half.plan(x_shape, w_shape).name == algorithm
    (y32,) = full.execute([x, w])
    (y16,) = half.execute([x, w])
    scale = np.abs(y32).max()
    np.testing.assert_allclose(y16, y32, rtol=0, atol=3e-3 * scale)
    if half_form is None:
        np.testing.assert_array_equal(y16, y32)  # its forms are float32 (or the constant itself)
        return
    form = getattr(half.weights, half_form)
    form = next(iter(form.values())) if isinstance(form, dict) else form[0]
    assert form.dtype == HALF_BITS
    float_form = getattr(full.weights, half_form)
    float_form = next(iter(float_form.values())) if isinstance(float_form, dict) else float_form[0]
    assert form.nbytes * 2 == float_form.nbytes
    assert not np.array_equal(y16, y32)
