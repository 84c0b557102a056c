"""A float32 GEMM by weights packed once at load: ``c = activation(a @ w + bias)`` for a
fully connected layer or a MatMul by a constant matrix, where ``a`` is the run's input.

The weights (K, N) are packed into panels of ``TILE_COLUMNS`` columns, each stored k-major
((K, TILE_COLUMNS), the last zero-padded): one step of the micro-kernel
(:func:`~flowrt.workers.cpu.acc.tile_ir._row_tile`) reads a panel's row of ``TILE_COLUMNS``
values and ``TILE_ROWS`` values of ``a``, one from each of its rows, in place. BLAS would copy
the weights into its own panels on every call: for a batch of 16 rows by a (2048, 2048)
weight matrix, that copy is as long as the multiply.

Rows of ``a`` are taken in chunks that stay in L2 while every panel passes over them (the
last rows, fewer than a tile, ride with the last chunk); a
slice of the output is a range of rows by a range of panels (:func:`plan`), so each worker
streams its own share of the larger operand.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
from numba import njit

from flowrt.engine.scheduler.window import SplitHint, split_bounds
from flowrt.workers.cpu.acc.blas import leading_dimension, read_only
from flowrt.workers.cpu.acc.calls import NATIVE, SliceFunction
from flowrt.workers.cpu.acc.half import HALF_BITS, to_half
from flowrt.workers.cpu.acc.kernels.epilogue import NONE, RELU, activate_late
from flowrt.workers.cpu.acc.tile_ir import AVAILABLE, TILE_COLUMNS, TILE_ROWS, _row_tile, _row_tile_part

__all__ = ["AVAILABLE", "PackedWeights", "Plan", "multiply", "pack", "plan"]

# Bytes of ``a``'s rows a chunk keeps in L2 while the panels pass over it.
CHUNK_BYTES = 256 * 1024
# Products summed in registers before the tile is added to the output: a block of the panel
# (16 KB with AVX2 tiles) stays in L1, and a long dot product's rounding error grows with
# DEPTH + K / DEPTH, not K (a 9216-long sum of positive terms: 6.6e-5 -> within 2e-5 of BLAS).
DEPTH = 256


class PackedWeights(NamedTuple):
    """Weights (K, N) packed as panels, and the bias (zeros where none) padded to them. The
    panels are float32, or float16 bits (``half.py``): the tiles widen them as they read."""

    panels: np.ndarray  # (ceil(N / TILE_COLUMNS), K, TILE_COLUMNS)
    bias: np.ndarray  # (panels * TILE_COLUMNS,)
    n: int


def pack(w: np.ndarray, bias: np.ndarray | None = None, half: bool = False) -> PackedWeights:
    """``w`` (K, N) as panels (:class:`PackedWeights`), of float16 bits if ``half``; ``bias``
    is (N,) or None."""
    panels = column_panels(w, half)
    return PackedWeights(panels, column_bias(panels, bias), w.shape[1])


def column_panels(w: np.ndarray, half: bool = False) -> np.ndarray:
    """``w`` (K, N) as read-only panels (ceil(N / TILE_COLUMNS), K, TILE_COLUMNS), the last
    one padded with zero columns; float16 bits (``half.to_half``) if ``half``."""
    k, n = w.shape
    count = -(-n // TILE_COLUMNS)
    # panel by panel: one copy of the weights, not a padded one and then the panels
    panels = np.zeros((count, k, TILE_COLUMNS), HALF_BITS if half else np.float32)
    for p in range(count):
        block = w[:, p * TILE_COLUMNS : (p + 1) * TILE_COLUMNS]
        panels[p, :, : block.shape[1]] = to_half(block) if half else block
    return read_only(panels)


def column_bias(panels: np.ndarray, bias: np.ndarray | None) -> np.ndarray:
    """``bias`` (N,) or None (zeros) padded to the columns of ``panels``, read-only."""
    padded = np.zeros(panels.shape[0] * TILE_COLUMNS, np.float32)
    if bias is not None:
        padded[: bias.shape[0]] = bias
    return read_only(padded)


class Plan(NamedTuple):
    """Row and panel boundaries of the slices: slice (i, j) is rows ``rows[i]:rows[i+1]`` by
    panels ``panels[j]:panels[j+1]``."""

    rows: np.ndarray
    panels: np.ndarray


def plan(m: int, weights: PackedWeights, workers: int) -> Plan:
    """Split the longer side across ``workers``: rows (in whole tiles) when ``a`` has more
    rows than the weights have columns, else panels."""
    count = weights.panels.shape[0]
    whole_rows, whole_panels = np.array([0, m], np.int64), np.array([0, count], np.int64)
    if workers <= 1:
        return Plan(whole_rows, whole_panels)
    if m > weights.n:
        tiles = -(-m // TILE_ROWS)
        bounds = np.minimum(split_bounds(tiles, SplitHint(axis=0, min_slice=1), workers) * TILE_ROWS, m)
        return Plan(bounds.astype(np.int64), whole_panels)
    return Plan(whole_rows, split_bounds(count, SplitHint(axis=1, min_slice=1), workers).astype(np.int64))


@njit(inline="always", nogil=True, cache=True)
def _block(a, a_at, lda, panels, q, k0, c, c_at, ldc, k, depth, bias, relu, accumulate, columns):
    """Rows ``a_at ..`` of ``a`` (one tile's) times rows ``k0 .. k0 + depth`` of panel ``q``
    into ``c`` from ``c_at`` on, onto the bias or (``accumulate``) onto what ``c`` holds."""
    b_at = (q * k + k0) * TILE_COLUMNS
    if columns == TILE_COLUMNS:
        _row_tile(
            a, a_at, lda, panels, b_at, TILE_COLUMNS, c, c_at, ldc, depth, bias, q * TILE_COLUMNS, relu,
            accumulate,
        )  # fmt: skip
    else:
        _row_tile_part(
            a, a_at, lda, panels, b_at, TILE_COLUMNS, c, c_at, ldc, depth, bias, q * TILE_COLUMNS, relu,
            accumulate, columns,
        )  # fmt: skip


@njit(**NATIVE)
def _slice(task, step, a, panels, bias, c, rows, panel_bounds, code, alpha, beta):
    """One slice of :func:`multiply` (a :class:`SliceFunction`): ``c[r0:r1]``'s columns of
    panels ``q0:q1`` = activation(``a[r0:r1] @ w + bias``), a range of rows by a range of
    panels; ``a`` (M, K) and ``c`` (M, N) are float32 with unit column stride."""
    row_slice, panel_slice = divmod(task, panel_bounds.shape[0] - 1)
    r0, r1 = rows[row_slice], rows[row_slice + 1]
    q0, q1 = panel_bounds[panel_slice], panel_bounds[panel_slice + 1]
    n = c.shape[1]
    k = a.shape[1]
    if r1 <= r0 or q1 <= q0:
        return
    lda, ldc = leading_dimension(a), leading_dimension(c)
    relu = 1 if code == RELU else 0
    full_end = r0 + (r1 - r0) // TILE_ROWS * TILE_ROWS
    tail = r1 - full_end
    spare = np.zeros((TILE_ROWS, k if tail > 0 else 0), np.float32)  # the last rows, zero-padded
    # Loops, not slice assignments: those compile numba's formatted messages for shapes that
    # do not broadcast (seconds on a cold cache).
    for i in range(tail):
        for j in range(k):
            spare[i, j] = a[full_end + i, j]
    out = np.empty((TILE_ROWS, TILE_COLUMNS), np.float32)
    # Rows in equal chunks of at most CHUNK_BYTES: every panel passes over a chunk in L2 once.
    chunks = max(1, -(-(r1 - r0) * k * 4 // CHUNK_BYTES))
    per_chunk = max(1, -(-(full_end - r0) // TILE_ROWS // chunks)) * TILE_ROWS
    c0 = r0
    while True:
        c1 = min(c0 + per_chunk, full_end)
        last = c1 >= full_end
        for q in range(q0, q1):
            columns = min(TILE_COLUMNS, n - q * TILE_COLUMNS)
            # K in blocks: a block of the panel stays in L1 over the chunk's rows, and each
            # sum runs over DEPTH products at most before it is added to the total.
            for k0 in range(0, max(k, 1), DEPTH):
                depth = min(DEPTH, k - k0)
                onto = 1 if k0 > 0 else 0
                rectify = relu if k0 + DEPTH >= k else 0
                for r in range(c0, c1, TILE_ROWS):
                    _block(
                        a, r * lda + k0, lda, panels, q, k0, c, r * ldc + q * TILE_COLUMNS, ldc, k, depth, bias,
                        rectify, onto, columns,
                    )  # fmt: skip
                if last and tail > 0:
                    _block(
                        spare,
                        k0,
                        k,
                        panels,
                        q,
                        k0,
                        out,
                        0,
                        TILE_COLUMNS,
                        k,
                        depth,
                        bias,
                        rectify,
                        onto,
                        columns,
                    )
            if last and tail > 0:
                for i in range(tail):
                    for j in range(columns):
                        c[full_end + i, q * TILE_COLUMNS + j] = out[i, j]
        if last:
            break
        c0 = c1
    if code != NONE and code != RELU:
        for i in range(r0, r1):
            row = c[i, q0 * TILE_COLUMNS : min(q1 * TILE_COLUMNS, n)]
            activate_late(row, code, alpha, beta)


_SLICE = SliceFunction(_slice)


def multiply(
    a: np.ndarray, weights: PackedWeights, c: np.ndarray, split: Plan, code: int, alpha, beta
) -> None:
    """``c = activation(a @ w + bias)``, one slice per (row range, panel range) of ``split``,
    in parallel; ``alpha`` and ``beta`` are the activation's parameters."""
    args = (
        read_only(a), weights.panels, weights.bias, c, split.rows, split.panels, np.int64(code),
        np.float32(alpha), np.float32(beta),
    )  # fmt: skip
    _SLICE.run((split.rows.shape[0] - 1) * (split.panels.shape[0] - 1), args)
