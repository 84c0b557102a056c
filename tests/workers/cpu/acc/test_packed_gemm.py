"""The GEMM by packed weights (``packed_gemm.py``) against numpy: every tail of rows and
columns, strided rows, each activation, every split, rows in several chunks."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flowrt.workers.cpu.acc import packed_gemm
from flowrt.workers.cpu.acc.kernels.epilogue import CLIP, LEAKY_RELU, NONE, RELU, SIGMOID
from flowrt.workers.cpu.acc.tile_ir import TILE_COLUMNS, TILE_ROWS

pytestmark = pytest.mark.skipif(not packed_gemm.AVAILABLE, reason="no register tiles on this CPU")

EXPECTED = {
    NONE: lambda y: y,
    RELU: lambda y: np.maximum(y, 0),
    LEAKY_RELU: lambda y: np.where(y >= 0, y, y * 0.1),
    CLIP: lambda y: np.clip(y, -0.5, 0.5),
    SIGMOID: lambda y: 1 / (1 + np.exp(-y)),
}
PARAMETERS = {LEAKY_RELU: (0.1, 0.0), CLIP: (-0.5, 0.5)}


def multiply(a, w, bias, c, code, workers):
    weights = packed_gemm.pack(w, bias)
    alpha, beta = PARAMETERS.get(code, (0.0, 0.0))
    packed_gemm.multiply(a, weights, c, packed_gemm.plan(a.shape[0], weights, workers), code, alpha, beta)


@settings(max_examples=40, deadline=None)
@given(
    m=st.integers(1, 3 * TILE_ROWS + 1),
    k=st.integers(1, 70),
    n=st.integers(1, 3 * TILE_COLUMNS + 3),
    code=st.sampled_from(list(EXPECTED)),
    with_bias=st.booleans(),
    a_pad=st.integers(0, 5),
    c_pad=st.integers(0, 5),
    workers=st.integers(1, 3),
    seed=st.integers(0, 2**16),
)
def test_packed_gemm_matches_numpy_on_strided_rows(m, k, n, code, with_bias, a_pad, c_pad, workers, seed):
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((m, k + a_pad), dtype=np.float32)[:, :k]
    w = rng.standard_normal((k, n), dtype=np.float32)
    bias = rng.standard_normal(n, dtype=np.float32) if with_bias else None
    canvas = np.full((m, n + 2 * c_pad), 7.0, np.float32)
    multiply(a, w, bias, canvas[:, c_pad : c_pad + n], code, workers)
    expected = EXPECTED[code](a.astype(np.float64) @ w + (0 if bias is None else bias))
    np.testing.assert_allclose(canvas[:, c_pad : c_pad + n], expected, rtol=1e-4, atol=1e-4)
    # the columns either side of c's view are untouched
    assert (canvas[:, :c_pad] == 7).all() and (canvas[:, c_pad + n :] == 7).all()


@pytest.mark.parametrize("m, k, n", [(400, 300, 40), (203, 700, 17), (5, 20000, 3)])
@pytest.mark.parametrize("workers", [1, 2])
def test_rows_beyond_one_chunk_and_a_last_partial_tile_are_all_computed(m, k, n, workers):
    assert m * k * 4 > packed_gemm.CHUNK_BYTES  # several chunks of rows
    rng = np.random.default_rng(0)
    a, w = rng.standard_normal((m, k), dtype=np.float32), rng.standard_normal((k, n), dtype=np.float32)
    c = np.full((m, n), np.nan, np.float32)
    multiply(a, w, None, c, RELU, workers)
    np.testing.assert_allclose(c, np.maximum(a.astype(np.float64) @ w, 0), rtol=1e-4, atol=1e-3)


def test_the_plan_splits_the_longer_side_in_whole_tiles():
    weights = packed_gemm.pack(np.zeros((8, 100), np.float32))  # 100 columns: 7 panels of 16
    tall = packed_gemm.plan(1000, weights, 2)
    assert list(tall.panels) == [0, weights.panels.shape[0]] and tall.rows[1] % TILE_ROWS == 0
    wide = packed_gemm.plan(10, weights, 2)
    assert list(wide.rows) == [0, 10] and len(wide.panels) == 3


def test_a_long_dot_product_is_summed_in_blocks_as_accurately_as_blas():
    rng = np.random.default_rng(0)
    a, w = rng.standard_normal((6, 9216), dtype=np.float32), rng.standard_normal((9216, 16), dtype=np.float32)
    c = np.empty((6, 16), np.float32)
    multiply(a, w, None, c, NONE, 1)
    exact = a.astype(np.float64) @ w
    # one running sum over all 9216 products was 5.2e-4 off; numpy's BLAS is 7e-5 off
    assert np.abs(c - exact).max() < 1.5e-4
