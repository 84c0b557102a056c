"""CpuAcc Gemm and MatMul against CpuRef: transposes, alpha/beta, C broadcasts, batches, splits."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kernelcases import ACTIVATIONS, close, run_on_acc

import flowrt
from flowrt.errors import ShapeError
from flowrt.registry import FusedActivation
from flowrt.types import TensorInfo
from flowrt.workers.cpu.acc import gemv, packed_gemm
from flowrt.workers.cpu.acc.blas import SMALL_GEMM, sgemm
from flowrt.workers.cpu.acc.kernels import epilogue
from flowrt.workers.cpu.acc.kernels.gemm import MIN_PARALLEL_WORK
from flowrt.workers.cpu.ref.kernels import load_all as ref_kernels

RELU = FusedActivation("Relu")


def run_both(kind, desc, inputs, *, workers=2, activation=None, constant=False, given_out=False):
    """CpuAcc's and CpuRef's results (CpuRef's then the activation, Relu or none)."""
    expected = np.asarray(ref_kernels()[kind](desc, *inputs))
    if activation is not None:
        expected = np.maximum(expected, 0)
    constants = tuple(inputs) if constant else (None,) * len(inputs)
    kernel, got = run_on_acc(
        kind, desc, inputs, expected, constants, activation, workers=workers, given_out=given_out
    )
    return kernel, got, expected


def _array(rng, shape):
    return rng.standard_normal(shape, dtype=np.float32)


C_SHAPES = {"none": None, "scalar": (), "row": "(N,)", "1xN": "(1,N)", "Mx1": "(M,1)", "MxN": "(M,N)"}


@settings(max_examples=30, deadline=None)
@given(
    m=st.integers(1, 70),
    k=st.integers(1, 40),
    n=st.integers(1, 150),
    trans_a=st.integers(0, 1),
    trans_b=st.integers(0, 1),
    alpha=st.sampled_from([1.0, 0.5, -2.0]),
    beta=st.sampled_from([1.0, 0.0, 3.0]),
    c_shape=st.sampled_from(list(C_SHAPES)),
    workers=st.integers(1, 3),
    relu=st.booleans(),
    constant=st.booleans(),
    given_out=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_gemm_matches_cpuref(
    m, k, n, trans_a, trans_b, alpha, beta, c_shape, workers, relu, constant, given_out, seed
):
    rng = np.random.default_rng(seed)
    a = _array(rng, (k, m) if trans_a else (m, k))
    b = _array(rng, (n, k) if trans_b else (k, n))
    inputs = [a, b]
    shape = C_SHAPES[c_shape]
    if shape is not None:
        dims = {"(N,)": (n,), "(1,N)": (1, n), "(M,1)": (m, 1), "(M,N)": (m, n)}.get(shape, shape)
        inputs.append(_array(rng, dims))
    desc = flowrt.descriptors.Gemm(alpha=alpha, beta=beta, transA=trans_a, transB=trans_b)
    _, got, expected = run_both(
        "Gemm", desc, inputs, workers=workers, activation=RELU if relu else None, constant=constant,
        given_out=given_out,
    )  # fmt: skip
    close(got, expected)


@pytest.mark.parametrize("m, n", [(1, 1000), (300, 20), (64, 64)])
@pytest.mark.parametrize("trans_b", [0, 1])
def test_gemm_splits_the_longer_side_across_workers(m, n, trans_b):
    rng = np.random.default_rng(0)
    a = _array(rng, (m, 50))
    b = _array(rng, (n, 50) if trans_b else (50, n))
    desc = flowrt.descriptors.Gemm(transB=trans_b)
    kernel, got, expected = run_both("Gemm", desc, [a, b, _array(rng, (n,))], activation=RELU)
    close(got, expected)
    split = kernel._splits[(m, n)]
    assert (len(split.rows), len(split.cols)) == ((2, 3) if n > m else (3, 2))


@pytest.mark.parametrize("vectors", [1, 2, 3, 4, 7])
@pytest.mark.parametrize("rows", [37, 64])
@pytest.mark.parametrize("code", [epilogue.NONE, epilogue.RELU])
def test_matrix_vector_products_of_several_vectors_match_numpy(vectors, rows, code):
    # vectors go through the weights four, then two, then one at a time; rows four at a time
    # with a tail, in two slices
    rng = np.random.default_rng(vectors * rows)
    k = 1024
    x, w, bias = _array(rng, (vectors, k)), _array(rng, (rows, k)), _array(rng, (rows,))
    out = np.full((vectors, rows), np.nan, np.float32)
    bounds = gemv.row_bounds(rows, k, 2)
    assert len(bounds) == 3
    gemv.gemv(w, x, bias, out, bounds, code, np.float32(0), np.float32(0))
    want = x.astype(np.float64) @ w.T.astype(np.float64) + bias
    close(out, np.maximum(want, 0) if code == epilogue.RELU else want)


@pytest.mark.skipif(not packed_gemm.AVAILABLE, reason="no vector tiles on this machine")
@pytest.mark.parametrize("m, n", [(1, 1000), (300, 20), (64, 64), (600, 500)])
@pytest.mark.parametrize("trans_a, trans_b", [(0, 0), (0, 1), (1, 1)])
def test_gemm_by_constant_weights_packs_them_once_and_splits_the_longer_side(m, n, trans_a, trans_b):
    rng = np.random.default_rng(0)
    a = _array(rng, (50, m) if trans_a else (m, 50))
    b = _array(rng, (n, 50) if trans_b else (50, n))
    desc = flowrt.descriptors.Gemm(alpha=0.5, beta=2.0, transA=trans_a, transB=trans_b)
    kernel, got, expected = run_both("Gemm", desc, [a, b, _array(rng, (n,))], activation=RELU, constant=True)
    close(got, expected)
    assert kernel.b is None and kernel.packed is not None
    if m <= gemv.MAX_VECTORS:  # weight rows times each row of A
        rows, _, bounds = kernel.packed._by_rows()
        assert rows.shape == (n, 50) and not kernel.packed._plans
        slices = 2 if n * 50 >= 2 * gemv.MIN_TASK_WEIGHTS else 1  # two workers
        assert len(bounds) == slices + 1 and bounds[0] == 0 and bounds[-1] == n
        return
    split = kernel.packed._plans[m]
    work = m * 50 * n
    if work < MIN_PARALLEL_WORK:
        assert (len(split.rows), len(split.panels)) == (2, 2)
    else:
        assert (len(split.rows), len(split.panels)) == ((2, 3) if n >= m else (3, 2))


@pytest.mark.parametrize("activation", [a for a in ACTIVATIONS if a is not None])
@pytest.mark.parametrize("kind", ["Gemm", "MatMul"])
@pytest.mark.parametrize("m", [37, 3])
def test_products_by_packed_weights_apply_every_fused_activation(activation, kind, m):
    rng = np.random.default_rng(1)
    a, b = _array(rng, (m, 70)), _array(rng, (70, 45))
    inputs = [a, b, _array(rng, (45,))] if kind == "Gemm" else [a, b]
    expected = ACTIVATIONS[activation](a @ b + (inputs[2] if kind == "Gemm" else 0))
    desc = flowrt.descriptors.Gemm() if kind == "Gemm" else None
    kernel, got = run_on_acc(kind, desc, inputs, expected, tuple(inputs), activation, workers=2)
    close(got, expected)
    assert kernel.packed is not None or not packed_gemm.AVAILABLE


def test_gemm_without_broadcast_rejects_a_smaller_c():
    rng = np.random.default_rng(0)
    desc = flowrt.descriptors.Gemm(opset=6)
    with pytest.raises(ShapeError, match=r"broadcast=0\) expects C of shape \(3, 4\)"):
        run_both("Gemm", desc, [_array(rng, (3, 2)), _array(rng, (2, 4)), _array(rng, (4,))])


@st.composite
def matmul_shapes(draw):
    """Operand shapes numpy's matmul takes: 1-D operands, and batch dims that broadcast."""
    m, k, n = draw(st.integers(1, 20)), draw(st.integers(1, 20)), draw(st.integers(1, 40))
    batch = draw(st.lists(st.integers(1, 3), max_size=3))
    a_batch = [d if draw(st.booleans()) else 1 for d in batch][draw(st.integers(0, len(batch))) :]
    b_batch = [d if draw(st.booleans()) else 1 for d in batch][draw(st.integers(0, len(batch))) :]
    a_shape = (k,) if draw(st.integers(0, 5)) == 0 else (*a_batch, m, k)
    b_shape = (k,) if draw(st.integers(0, 5)) == 0 else (*b_batch, k, n)
    return a_shape, b_shape


@settings(max_examples=30, deadline=None)
@given(
    shapes=matmul_shapes(),
    workers=st.integers(1, 3),
    relu=st.booleans(),
    given_out=st.booleans(),
    constant=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_matmul_matches_cpuref(shapes, workers, relu, given_out, constant, seed):
    rng = np.random.default_rng(seed)
    a, b = _array(rng, shapes[0]), _array(rng, shapes[1])
    _, got, expected = run_both(
        "MatMul", None, [a, b], workers=workers, activation=RELU if relu else None, given_out=given_out,
        constant=constant,
    )  # fmt: skip
    close(got, expected)


def test_matmul_by_a_run_matrix_splits_a_single_product():
    rng = np.random.default_rng(0)
    a, b = _array(rng, (1, 2, 512)), _array(rng, (512, 300))
    kernel, got, expected = run_both("MatMul", None, [a, b])
    close(got, expected)
    assert len(kernel.plan(a.shape, b.shape).split.cols) == 3


def test_matmul_by_one_matrix_stacks_the_batch_into_one_product():
    rng = np.random.default_rng(0)
    a, b = _array(rng, (2, 3, 5, 16)), _array(rng, (16, 7))
    kernel, got, expected = run_both("MatMul", None, [a, b])
    close(got, expected)
    plan = kernel.plan(a.shape, b.shape)
    assert (plan.rows, len(plan.a_index)) == (30, 1)


@pytest.mark.parametrize("kind", ["Gemm", "MatMul"])
def test_non_float32_products_are_declined_with_a_reason(kind):
    support = flowrt.backend_registry().get("CpuAcc").layer_support()
    desc = flowrt.descriptors.Gemm() if kind == "Gemm" else None
    answer = support.is_layer_supported(
        kind, desc, [TensorInfo((2, 3), "float64"), TensorInfo((3, 4), "float64")], [None]
    )
    assert not answer.supported and answer.reason == f"CpuAcc {kind} takes float32 only"


@pytest.mark.parametrize("trans_a", [False, True])
@pytest.mark.parametrize("trans_b", [False, True])
@pytest.mark.parametrize(
    ("m", "k", "n"), [(16, 64, 3025), (3, 5, 200_000), (64, 147, 300), (250, 250, 17), (4, 20_000, 40)]
)
def test_sgemm_in_blocks_of_columns_matches_numpy(m, k, n, trans_a, trans_b):
    # Small m * k: run in blocks of columns (each within SMALL_GEMM), on views of larger arrays;
    # m=4, k=20000: blocks of 12 columns when b is transposed (a fully connected layer).
    assert m * k * n > SMALL_GEMM
    rng = np.random.default_rng(m + n)
    a_full = rng.standard_normal((k + 2, m + 3) if trans_a else (m + 2, k + 3)).astype(np.float32)
    b_full = rng.standard_normal((n + 2, k + 3) if trans_b else (k + 2, n + 3)).astype(np.float32)
    a = a_full[1 : k + 1, 2 : m + 2] if trans_a else a_full[1 : m + 1, 2 : k + 2]
    b = b_full[1 : n + 1, 2 : k + 2] if trans_b else b_full[1 : k + 1, 2 : n + 2]
    c_full = rng.standard_normal((m + 2, n + 4)).astype(np.float32)
    c = c_full[1 : m + 1, 1 : n + 1]
    expected = 0.5 * ((a.T if trans_a else a) @ (b.T if trans_b else b)) + 2.0 * c
    untouched = c_full.copy()
    sgemm(trans_a, trans_b, 0.5, a, b, 2.0, c)
    np.testing.assert_allclose(c, expected, rtol=2e-4, atol=2e-4 * np.abs(expected).max())
    # nothing outside the view was written
    np.testing.assert_array_equal(c_full[0], untouched[0])
    np.testing.assert_array_equal(c_full[:, n + 1 :], untouched[:, n + 1 :])
