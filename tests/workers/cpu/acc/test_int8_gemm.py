"""The exact uint8 x int8 GEMM (``int8_gemm.py``) against numpy's int64 products: the VNNI
micro-kernel (where the host has VNNI), both AVX2 ones and the portable loops, every tail of rows, columns and k, column ranges,
strided operands, extreme values, rounding half to even, and FLOWRT_TILES=off in a process of
its own."""

import os
import subprocess
import sys
import textwrap
from unittest import mock

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from numba import njit

from flowrt.errors import BackendError
from flowrt.workers.cpu.acc import int8_gemm
from flowrt.workers.cpu.acc.int8_gemm import INT16, MADDUBS, PORTABLE, TILE_COLUMNS, TILE_ROWS, VNNI

SENTINEL = 7


def expected(w, x, bias, scale, zero_point, lo, hi):
    """(int32 acc + bias, the requantized uint8), as numpy computes them."""
    acc = w.astype(np.int64) @ x.astype(np.int64) + bias[:, None]
    assert np.abs(acc).max(initial=0) < 2**31
    requantized = np.clip(np.rint(acc.astype(np.float32) * scale[:, None]) + zero_point, lo, hi)
    return acc.astype(np.int32), requantized.astype(np.uint8)


def weights(rng, m, k, full_range):
    low, high = (-128, 128) if full_range else (-64, 65)
    return rng.integers(low, high, (m, k)).astype(np.int8)


def pack(w, portable, vnni=True):
    """``pack_weights(w)``, or as on a host without AVX2 (the portable loops), or (``vnni``
    False) as on one without VNNI (the maddubs or int16 kernel)."""
    if portable:
        with mock.patch.object(int8_gemm, "AVAILABLE", False):
            return int8_gemm.pack_weights(w)
    if not vnni:
        with mock.patch.object(int8_gemm, "VNNI_AVAILABLE", False):
            return int8_gemm.pack_weights(w)
    return int8_gemm.pack_weights(w)


def kernel_packed(w, kernel):
    """``w`` packed for ``kernel`` (VNNI only where the host has it: the caller checks)."""
    return pack(w, portable=kernel == PORTABLE, vnni=kernel == VNNI)


def chosen_kernel(w, kernel):
    """The kernel :func:`kernel_packed` gives ``w`` for ``kernel``."""
    if kernel == PORTABLE or not int8_gemm.AVAILABLE:
        return PORTABLE
    if kernel == VNNI:
        return VNNI
    return MADDUBS if np.abs(w.astype(int)).max(initial=0) <= 64 else INT16


def canvas(dtype, m, n, pad):
    """A (m, n) view with ``pad`` columns of SENTINEL either side (row stride n + 2 pad)."""
    full = np.full((m, n + 2 * pad), SENTINEL, dtype)
    return full, full[:, pad : pad + n]


def both_products(packed, x, n0, n1, bias, scale, zero_point, lo, hi, pad=0):
    """(igemm's int32 canvas, qgemm's uint8 canvas) for columns [n0, n1) of views padded by ``pad``."""
    m, n = packed.m, x.shape[1]
    raw, raw_view = canvas(np.int32, m, n, pad)
    int8_gemm.igemm(packed, x, n0, n1, bias, raw_view)
    requantized, requantized_view = canvas(np.uint8, m, n, pad)
    int8_gemm.qgemm(packed, x, n0, n1, bias, scale, zero_point, lo, hi, requantized_view)
    return raw, requantized


def assert_columns_match(full, pad, n0, n1, want):
    """Columns [n0, n1) of the view hold ``want``'s; every other element of ``full`` is untouched."""
    np.testing.assert_array_equal(full[:, pad + n0 : pad + n1], want[:, n0:n1])
    untouched = np.ones(full.shape, bool)
    untouched[:, pad + n0 : pad + n1] = False
    assert (full[untouched] == SENTINEL).all()


@settings(max_examples=60, deadline=None)
@given(
    m=st.integers(1, 3 * TILE_ROWS + 1),
    k=st.sampled_from([1, 2, 3, 4, 5, 7, 8, 17, 64, 65, 130]),
    n=st.integers(1, 3 * TILE_COLUMNS + 3),
    kernel=st.sampled_from([MADDUBS, INT16, PORTABLE, VNNI]),
    x_pad=st.integers(0, 5),
    out_pad=st.integers(0, 3),
    per_channel=st.booleans(),
    bounds=st.sampled_from([(0, 255), (10, 255), (0, 200), (17, 18)]),
    zero_point=st.integers(0, 255),
    data=st.data(),
    seed=st.integers(0, 2**16),
)
def test_products_match_numpy_on_column_ranges_of_strided_views(
    m, k, n, kernel, x_pad, out_pad, per_channel, bounds, zero_point, data, seed
):
    assume(kernel != VNNI or int8_gemm.VNNI_AVAILABLE)
    rng = np.random.default_rng(seed)
    n0 = data.draw(st.integers(0, n), label="n0")
    n1 = data.draw(st.integers(n0, n), label="n1")
    w = weights(rng, m, k, full_range=kernel in (INT16, VNNI))
    x = rng.integers(0, 256, (k, n + x_pad), dtype=np.uint8)[:, :n]  # row stride n + x_pad
    bias = rng.integers(-(2**20), 2**20, m).astype(np.int32)
    scale = rng.uniform(1e-4, 3e-3, m if per_channel else 1).astype(np.float32)
    scale = np.broadcast_to(scale, (m,)).copy()
    packed = kernel_packed(w, kernel)
    assert packed.kernel == chosen_kernel(w, kernel)
    raw, requantized = both_products(packed, x, n0, n1, bias, scale, zero_point, *bounds, pad=out_pad)
    acc, want = expected(w, x, bias, scale, zero_point, *bounds)
    assert_columns_match(raw, out_pad, n0, n1, acc)
    assert_columns_match(requantized, out_pad, n0, n1, want)


@pytest.mark.skipif(not int8_gemm.VNNI_AVAILABLE, reason="the column tiles are VNNI's")
@pytest.mark.parametrize("m", [1, TILE_ROWS, 4 * TILE_ROWS, 4 * TILE_ROWS * 3 + TILE_ROWS + 3])
@pytest.mark.parametrize(("k", "n", "n0", "n1"), [(1281, 1, 0, 1), (64, 7, 2, 6), (9, 4, 0, 4)])
@pytest.mark.parametrize("transposed", [False, True])
def test_a_few_columns_are_multiplied_one_at_a_time_exactly(m, k, n, n0, n1, transposed):
    """At most FEW_COLUMNS columns go through the column tiles: COLUMN_PANELS panels at once,
    then single panels, then the last rows of a partial panel."""
    assert n1 - n0 <= int8_gemm.FEW_COLUMNS
    rng = np.random.default_rng(m + k + n)
    w = weights(rng, m, k, full_range=True)
    x = rng.integers(0, 256, (k, n + 3), dtype=np.uint8)[:, :n]
    bias = rng.integers(-(2**20), 2**20, m).astype(np.int32)
    scale = rng.uniform(1e-4, 3e-3, m).astype(np.float32)
    packed = kernel_packed(w, VNNI)
    _, want = expected(w, x, bias, scale, 9, 0, 255)
    if transposed:
        out = np.full((n, m), SENTINEL, np.uint8)
        xt = np.ascontiguousarray(x.T)
        int8_gemm.qgemm_rows(packed.panels, packed.kernel, m, xt, n0, n1, bias, scale, 9, 0, 255, out)
        out = out.T
    else:
        out = np.full((m, n), SENTINEL, np.uint8)
        int8_gemm.qgemm(packed, x, n0, n1, bias, scale, 9, 0, 255, out)
    np.testing.assert_array_equal(out[:, n0:n1], want[:, n0:n1])
    assert (np.delete(out, np.s_[n0:n1], axis=1) == SENTINEL).all()


@pytest.mark.parametrize(
    "x_value, w_value, kernel",
    [(255, -128, INT16), (255, 127, INT16), (255, 64, MADDUBS), (255, -64, MADDUBS), (255, 65, INT16),
     (0, -128, INT16), (1, -1, MADDUBS), (255, -128, VNNI), (255, 127, VNNI), (0, -128, VNNI),
     (1, -1, VNNI), (255, -1, PORTABLE), (255, -128, PORTABLE)],
)  # fmt: skip
def test_extreme_values_are_exact(x_value, w_value, kernel):
    if kernel == VNNI and not int8_gemm.VNNI_AVAILABLE:
        pytest.skip("no VNNI on this CPU")
    m, k, n = 2 * TILE_ROWS + 1, 4099, TILE_COLUMNS + 5  # |acc| up to 255 * 128 * 4099, in int32
    w = np.full((m, k), w_value, np.int8)
    x = np.full((k, n), x_value, np.uint8)
    packed = kernel_packed(w, kernel)
    assert packed.kernel == chosen_kernel(w, kernel)
    bias = np.arange(m, dtype=np.int32) - 3
    scale = np.full(m, 1 / 4096, np.float32)
    raw, requantized = both_products(packed, x, 0, n, bias, scale, 100, 0, 255)
    acc, want = expected(w, x, bias, scale, 100, 0, 255)
    np.testing.assert_array_equal(raw, acc)
    np.testing.assert_array_equal(requantized, want)


def test_pack_weights_takes_maddubs_for_seven_bit_weights_only_without_vnni():
    if not int8_gemm.AVAILABLE:
        pytest.skip("no AVX2 on this CPU: the portable loops")
    assert pack(np.array([[-64, 64, 0]], np.int8), False, vnni=False).kernel == MADDUBS
    assert pack(np.array([[-65, 0, 0]], np.int8), False, vnni=False).kernel == INT16
    assert pack(np.array([[0, 65, 0]], np.int8), False, vnni=False).kernel == INT16
    packed = pack(np.zeros((5, 9), np.int8), False, vnni=False)
    assert (packed.m, packed.k, packed.padded_k) == (5, 9, 12)


def test_pack_weights_takes_vnni_for_any_weights_where_the_host_has_it():
    if not int8_gemm.VNNI_AVAILABLE:
        pytest.skip("no VNNI on this CPU")
    for w in ([[-64, 64, 0]], [[-128, 127, 0]]):
        packed = int8_gemm.pack_weights(np.array(w, np.int8))
        assert (packed.kernel, int8_gemm.KERNEL_NAMES[packed.kernel]) == (VNNI, "vnni")
        assert packed.panels.dtype == np.int8 and packed.padded_k == 4


def test_row_sums_are_int32_sums_of_each_row():
    w = np.array([[127, 127, -128], [-128, -128, -128]], np.int8)
    sums = int8_gemm.row_sums(w)
    assert sums.dtype == np.int32
    np.testing.assert_array_equal(sums, [126, -384])
    np.testing.assert_array_equal(int8_gemm.pack_weights(w).row_sums, sums)


@pytest.mark.parametrize("portable", [False, True])
def test_requantization_rounds_half_to_even_then_clamps(portable):
    # acc = x, scale 0.5: every odd acc + bias is a tie; bias -255 makes them negative
    x = np.arange(256, dtype=np.uint8)[None, :]
    packed = pack(np.ones((1, 1), np.int8), portable)
    scale = np.full(1, 0.5, np.float32)
    results = {}
    for bias, zero_point, lo, hi in [(0, 0, 0, 255), (-255, 128, 0, 255), (-255, 0, 3, 250), (0, 0, 3, 250)]:
        _, requantized = both_products(
            packed, x, 0, 256, np.full(1, bias, np.int32), scale, zero_point, lo, hi
        )
        values = np.arange(256) + bias
        np.testing.assert_array_equal(requantized[0], np.clip(np.round(values / 2) + zero_point, lo, hi))
        results[bias, zero_point, lo] = dict(zip(values.tolist(), requantized[0].tolist(), strict=True))
    # ties to even, spelled out: 0.5 -> 0, 1.5 -> 2, 2.5 -> 2, -0.5 -> 0, -1.5 -> -2, -2.5 -> -2
    assert [results[0, 0, 0][v] for v in (1, 3, 5)] == [0, 2, 2]
    assert [results[-255, 128, 0][v] for v in (-1, -3, -5)] == [128, 126, 126]
    assert results[-255, 0, 3][-1] == 3 and results[0, 0, 3][255] == 128  # clamped up; within


@pytest.mark.parametrize("portable", [False, True])
def test_no_reduction_stores_the_bias_and_no_rows_or_columns_store_nothing(portable):
    bias = np.array([5, -6, 7], np.int32)
    packed = pack(np.zeros((3, 0), np.int8), portable)
    raw, _ = both_products(
        packed, np.zeros((0, 20), np.uint8), 0, 20, bias, np.ones(3, np.float32), 0, 0, 255
    )
    np.testing.assert_array_equal(raw, np.repeat(bias[:, None], 20, axis=1))
    packed = pack(np.ones((3, 4), np.int8), portable)
    raw, requantized = both_products(
        packed, np.ones((4, 20), np.uint8), 9, 9, bias, np.ones(3, np.float32), 0, 0, 255
    )
    assert (raw == SENTINEL).all() and (requantized == SENTINEL).all()


@njit
def _in_halves(panels, kernel, m, x, bias, scale, out):
    """qgemm_columns from compiled code, as a worker's split of the columns."""
    half = x.shape[1] // 2
    int8_gemm.qgemm_columns(panels, kernel, m, x, 0, half, bias, scale, 3, 0, 255, out)
    int8_gemm.qgemm_columns(panels, kernel, m, x, half, x.shape[1], bias, scale, 3, 0, 255, out)


def test_qgemm_columns_is_callable_from_compiled_code():
    rng = np.random.default_rng(5)
    w, x = weights(rng, 9, 70, full_range=False), rng.integers(0, 256, (70, 45), dtype=np.uint8)
    bias, scale = rng.integers(-500, 500, 9).astype(np.int32), np.full(9, 2e-3, np.float32)
    packed = int8_gemm.pack_weights(w)
    out = np.empty((9, 45), np.uint8)
    _in_halves(packed.panels, packed.kernel, packed.m, x, bias, scale, out)
    np.testing.assert_array_equal(out, expected(w, x, bias, scale, 3, 0, 255)[1])


def _operands():
    packed = int8_gemm.pack_weights(np.ones((3, 5), np.int8))
    return (
        packed,
        np.zeros((5, 8), np.uint8),
        np.zeros(3, np.int32),
        np.ones(3, np.float32),
        np.empty((3, 8), np.uint8),
    )


@pytest.mark.parametrize(
    "change, message",
    [
        ({"x": np.zeros((5, 8), np.int8)}, r"expected x uint8 \(5, N\), got int8 \(5, 8\)"),
        ({"x": np.zeros((4, 8), np.uint8)}, r"expected x uint8 \(5, N\), got uint8 \(4, 8\)"),
        ({"x": np.zeros((5, 16), np.uint8)[:, ::2]}, r"expected x with unit column stride"),
        ({"out": np.empty((3, 8), np.int32)}, r"expected out uint8 \(3, 8\), got int32 \(3, 8\)"),
        ({"out": np.empty((3, 7), np.uint8)}, r"expected out uint8 \(3, 8\), got uint8 \(3, 7\)"),
        ({"n1": 9}, r"expected columns 0 <= n0 <= n1 <= 8, got \[0, 9\)"),
        ({"n0": 5, "n1": 4}, r"got \[5, 4\)"),
        ({"bias": np.zeros(3, np.int64)}, r"expected bias int32 \(3,\), got int64 \(3,\)"),
        ({"scale": np.ones(4, np.float32)}, r"expected scale float32 \(3,\), got float32 \(4,\)"),
        ({"scale": np.ones(3)}, r"expected scale float32 \(3,\), got float64 \(3,\)"),
        ({"lo": 9, "hi": 8}, r"expected bounds 0 <= lo <= hi <= 255, got lo=9, hi=8"),
        ({"packed": np.ones((3, 5), np.int8)}, r"expected PackedInt8Weights \(pack_weights\), got ndarray"),
    ],
)
def test_bad_operands_are_refused_with_what_was_expected(change, message):
    packed, x, bias, scale, out = _operands()
    args = {"packed": packed, "x": x, "n0": 0, "n1": 8, "bias": bias, "scale": scale, "out_zero_point": 0,
            "lo": 0, "hi": 255, "out": out} | change  # fmt: skip
    with pytest.raises(BackendError, match=message):
        int8_gemm.qgemm(**args)


def test_bad_weights_and_int32_outputs_are_refused():
    with pytest.raises(BackendError, match=r"expected a 2-D int8 array, got uint8 \(2, 2\)"):
        int8_gemm.pack_weights(np.zeros((2, 2), np.uint8))
    packed, x, bias, _, _ = _operands()
    with pytest.raises(BackendError, match=r"expected out int32 \(3, 8\), got uint8 \(3, 8\)"):
        int8_gemm.igemm(packed, x, 0, 8, bias, np.empty((3, 8), np.uint8))


def test_tiles_off_uses_the_portable_loops_exactly(tmp_path):
    script = textwrap.dedent(
        """
        import numpy as np
        from flowrt.workers.cpu.acc import int8_gemm
        rng = np.random.default_rng(1)
        for m, k, n, high in [(1, 1, 1, 128), (7, 13, 600, 65), (13, 64, 100, 128)]:
            w = rng.integers(-128, high, (m, k)).astype(np.int8)
            x = rng.integers(0, 256, (k, n + 3), dtype=np.uint8)[:, :n]
            bias, scale = rng.integers(-999, 999, m).astype(np.int32), np.full(m, 1e-3, np.float32)
            packed = int8_gemm.pack_weights(w)
            assert packed.kernel == int8_gemm.PORTABLE
            out, raw = np.empty((m, n), np.uint8), np.empty((m, n), np.int32)
            int8_gemm.qgemm(packed, x, 0, n, bias, scale, 9, 5, 250, out)
            int8_gemm.igemm(packed, x, 0, n, bias, raw)
            acc = w.astype(np.int64) @ x + bias[:, None]
            np.testing.assert_array_equal(raw, acc)
            want = np.clip(np.rint(acc.astype(np.float32) * scale[:, None]) + 9, 5, 250)
            np.testing.assert_array_equal(out, want.astype(np.uint8))
        print(int8_gemm.AVAILABLE)
        """
    )
    env = dict(os.environ, FLOWRT_TILES="off", NUMBA_CACHE_DIR=str(tmp_path))
    done = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["False"]
