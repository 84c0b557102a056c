"""The register-tile GEMM (``tiles.py``) against numpy: every tail of rows and columns, strided
operands, each activation; the AVX2 tile shape in a process of its own."""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flowrt.errors import BackendError
from flowrt.workers.cpu.acc import tile_ir, tiles
from flowrt.workers.cpu.acc.kernels.epilogue import CLIP, LEAKY_RELU, NONE, RELU, SIGMOID

pytestmark = pytest.mark.skipif(not tile_ir.AVAILABLE, reason="no register tiles on this CPU (BLAS is used)")

EXPECTED = {
    NONE: lambda y: y,
    RELU: lambda y: np.maximum(y, 0),
    LEAKY_RELU: lambda y: np.where(y >= 0, y, y * 0.1),
    CLIP: lambda y: np.clip(y, -0.5, 0.5),
    SIGMOID: lambda y: 1 / (1 + np.exp(-y)),
}
ALPHA = {LEAKY_RELU: 0.1, CLIP: -0.5}


def run_tiles(w, bias, b, c, code):
    beta = 0.5 if code == CLIP else 0.0
    tiles.gemm_panels(
        tiles.pack_panels(w),
        tiles.pad_rows(bias),
        b,
        c,
        code,
        np.float32(ALPHA.get(code, 0)),
        np.float32(beta),
    )


@settings(max_examples=40, deadline=None)
@given(
    m=st.integers(1, 3 * tile_ir.TILE_ROWS + 1),
    k=st.integers(1, 70),
    n=st.integers(1, 3 * tile_ir.TILE_COLUMNS + 3),
    code=st.sampled_from(list(EXPECTED)),
    b_pad=st.integers(0, 5),
    c_pad=st.integers(0, 5),
    seed=st.integers(0, 2**16),
)
def test_gemm_panels_matches_numpy_on_strided_views(m, k, n, code, b_pad, c_pad, seed):
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((m, k), dtype=np.float32)
    bias = rng.standard_normal(m, dtype=np.float32)
    b = rng.standard_normal((k, n + 2 * b_pad), dtype=np.float32)[:, b_pad : b_pad + n]
    canvas = np.full((m, n + 2 * c_pad), 7.0, np.float32)
    run_tiles(w, bias, b, canvas[:, c_pad : c_pad + n], code)
    expected = EXPECTED[code](w.astype(np.float64) @ b + bias[:, None])
    np.testing.assert_allclose(canvas[:, c_pad : c_pad + n], expected, rtol=1e-4, atol=1e-4)
    # the columns either side of c's view are untouched
    assert (canvas[:, :c_pad] == 7).all() and (canvas[:, c_pad + n :] == 7).all()


@pytest.mark.parametrize("code", list(EXPECTED))
@pytest.mark.parametrize("k", [tiles.DEPTH_MAX + 1, 3 * tiles.DEPTH + 5])
def test_a_long_product_is_summed_in_blocks_of_k_then_activated_once(k, code):
    # past DEPTH_MAX steps each tile runs over blocks of about DEPTH steps, the first from the
    # bias, the next onto what c holds; the activation only on the total; a padded last
    # panel and a masked last block of columns, in strided views
    m, n = 2 * tile_ir.TILE_ROWS + 3, tile_ir.TILE_COLUMNS + 5
    rng = np.random.default_rng(k + code)
    w, bias = rng.standard_normal((m, k), dtype=np.float32), rng.standard_normal(m, dtype=np.float32)
    b = rng.standard_normal((k, n + 2), dtype=np.float32)[:, 1 : 1 + n]
    canvas = np.full((m, n + 4), 7.0, np.float32)
    run_tiles(w, bias, b, canvas[:, 2 : 2 + n], code)
    expected = EXPECTED[code](w.astype(np.float64) @ b + bias[:, None])
    np.testing.assert_allclose(canvas[:, 2 : 2 + n], expected, rtol=1e-4, atol=1e-3)
    assert (canvas[:, :2] == 7).all() and (canvas[:, 2 + n :] == 7).all()


@pytest.mark.parametrize("code", [SIGMOID, LEAKY_RELU, NONE])
def test_a_curve_is_applied_block_by_block_over_every_column(code):
    # 200 rows: blocks of CURVE_BLOCK_FLOATS // 200 columns, rounded down to whole tiles; 2.5
    # blocks of them, c a view inside a wider canvas
    m, k = 200, 8
    block = max(
        tile_ir.TILE_COLUMNS, tiles.CURVE_BLOCK_FLOATS // m // tile_ir.TILE_COLUMNS * tile_ir.TILE_COLUMNS
    )
    n = 2 * block + block // 2 + 3
    rng = np.random.default_rng(3)
    w, bias = rng.standard_normal((m, k), dtype=np.float32), rng.standard_normal(m, dtype=np.float32)
    b = rng.standard_normal((k, n), dtype=np.float32)
    canvas = np.full((m, n + 4), 7.0, np.float32)
    run_tiles(w, bias, b, canvas[:, 2 : 2 + n], code)
    expected = EXPECTED[code](w.astype(np.float64) @ b + bias[:, None])
    np.testing.assert_allclose(canvas[:, 2 : 2 + n], expected, rtol=1e-4, atol=1e-4)
    assert (canvas[:, :2] == 7).all() and (canvas[:, 2 + n :] == 7).all()


def test_relu_keeps_nan_and_clears_negative_zero_as_activate_does():
    w = np.ones((tile_ir.TILE_ROWS, 1), np.float32)
    b = np.full((1, tile_ir.TILE_COLUMNS + 3), -0.0, np.float32)
    b[0, 1] = np.nan
    b[0, -1] = np.nan  # in the masked tail
    c = np.empty((tile_ir.TILE_ROWS, b.shape[1]), np.float32)
    run_tiles(w, np.full(tile_ir.TILE_ROWS, -0.0, np.float32), b, c, RELU)
    assert np.isnan(c[:, 1]).all() and np.isnan(c[:, -1]).all()
    rest = np.delete(c, [1, b.shape[1] - 1], axis=1)
    assert (rest == 0).all() and not np.signbit(rest).any()


def test_an_empty_product_writes_only_the_bias():
    c = np.empty((3, 40), np.float32)
    run_tiles(
        np.zeros((3, 0), np.float32), np.array([1, 2, 3], np.float32), np.zeros((0, 40), np.float32), c, NONE
    )
    np.testing.assert_array_equal(c, np.repeat([[1], [2], [3]], 40, axis=1))


def test_an_unknown_tile_choice_is_refused_with_the_choices():
    with pytest.raises(BackendError, match=r"FLOWRT_TILES must be one of .*'avx2'.*got 'avx3'"):
        tile_ir._tile_shape("avx3")


_GEMM_SCRIPT = textwrap.dedent(
    """
        import numpy as np
        from flowrt.workers.cpu.acc import tile_ir, tiles
        rng = np.random.default_rng(1)
        for m, k, n in [(1, 1, 1), (7, 13, 17), (13, 64, 100)]:
            w, b = rng.standard_normal((m, k), dtype=np.float32), rng.standard_normal((k, n), dtype=np.float32)
            bias, c = rng.standard_normal(m, dtype=np.float32), np.empty((m, n), np.float32)
            tiles.gemm_panels(tiles.pack_panels(w), tiles.pad_rows(bias), b, c, 1, np.float32(0), np.float32(0))
            np.testing.assert_allclose(c, np.maximum(w.astype(np.float64) @ b + bias[:, None], 0), rtol=1e-4, atol=1e-4)
        print(tile_ir.TILE_ROWS, tile_ir.TILE_COLUMNS)
        """
)


def _gemm_with_tiles(choice: str, cache: Path) -> list[str]:
    """The tile shape a process with ``FLOWRT_TILES=choice`` and numba's cache in ``cache``
    reports, after checking its tiled GEMMs against numpy (an assertion error otherwise)."""
    env = dict(os.environ, FLOWRT_TILES=choice, NUMBA_CACHE_DIR=str(cache))
    done = subprocess.run(
        [sys.executable, "-c", _GEMM_SCRIPT], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.split()


def test_the_avx2_tile_shape_computes_the_same(tmp_path):
    assert _gemm_with_tiles("avx2", tmp_path) == ["6", "16"]


def test_kernels_cached_for_one_tile_shape_are_not_taken_for_another(tmp_path):
    # The tile shape is compiled into the kernels: a cache filled under one FLOWRT_TILES
    # must not serve another (it did, and AVX2's panels went through AVX-512's code: NaNs).
    assert _gemm_with_tiles("avx512", tmp_path) == ["8", "32"]
    assert _gemm_with_tiles("avx2", tmp_path) == ["6", "16"]
