"""A float32 GEMM for weights packed once at load: ``c = activation(w @ b + bias)``, by CpuAcc's
register tiles (``tile_ir.py``).

The weights (M, K) are packed into panels of ``TILE_ROWS`` rows, each stored k-major ((K,
TILE_ROWS), the last panel zero-padded), so that one step of the micro-kernel reads a panel's
``TILE_ROWS`` values side by side. The right operand ``b`` (K, N) is read in place, a block of
``TILE_COLUMNS`` columns at a time, from its rows at any stride: a conv's input or column
matrix needs no packing. Each block of columns is multiplied by every panel in turn while it
stays in L1/L2, in blocks of k past ``DEPTH_MAX`` steps; bias and ReLU are applied as the
accumulators are stored, other activations on the stored tile.

On one Zen 4 core, for the 1x1 convs of DenseNet-121 (M=128, K=64-1024, N=196-3136 pixels),
this runs at 100-117 GFLOP/s where OpenBLAS's packed SGEMM on the same operands runs at 66-100.
"""

from __future__ import annotations

import numba
import numpy as np
from numba import njit, types
from numba._dispatcher import compute_fingerprint

from flowrt.workers.cpu.acc.blas import leading_dimension, native_address
from flowrt.workers.cpu.acc.kernels.epilogue import CLIP, NONE, RELU, activate_in_place
from flowrt.workers.cpu.acc.kernels.pool_vectors import copy_floats
from flowrt.workers.cpu.acc.tile_ir import (
    CLIP_MODE,
    LANES,
    ONTO_BIAS,
    RELU_MODE,
    TILE_COLUMNS,
    TILE_ROWS,
    _narrow_tile_part,
    _tile,
    _tile_part,
)

# The block of ``c`` (floats, 512 KB) that :func:`gemm_panels` finishes before applying a curve
# other than Relu and Clip to it, a call per row of the block: it is still in L2 (or L3) then,
# and each call has hundreds of columns (blocks of 32K floats, 336 columns at 96 rows, made
# the calls cost about what the cache saved).
CURVE_BLOCK_FLOATS = 128 * 1024

# The residual of c (floats, 256 KB) that gemm_panels_onto copies into c at a time.
RESIDUAL_SPAN_FLOATS = 64 * 1024

# Steps of k a tile takes at a time (about) where k is longer than DEPTH_MAX: a block of b's
# columns (DEPTH x TILE_COLUMNS floats) then stays in L1 while each panel reads it, and with
# few panels (a small M) so do the panels' steps for that block: at 192 steps (24 KB of b)
# the four panels of M=32 (24 KB more) did not fit beside it. One Zen 5 core, 192 -> 96 steps:
# M=32 K=192 N=784 167 -> 215 GFLOP/s, M=24 K=144 N=3136 182 -> 213, M=64 K=576 N=3136
# 204 -> 219; M of 128 to 2048 within +-3%.
DEPTH = 96
DEPTH_MAX = 96


def pack_panels(w: np.ndarray) -> np.ndarray:
    """Weights (M, K) as panels (ceil(M / TILE_ROWS), K, TILE_ROWS), the last zero-padded."""
    m, k = w.shape
    panels = -(-m // TILE_ROWS)
    padded = np.zeros((panels * TILE_ROWS, k), np.float32)
    padded[:m] = w
    return np.ascontiguousarray(padded.reshape(panels, TILE_ROWS, k).transpose(0, 2, 1))


def pad_rows(bias: np.ndarray) -> np.ndarray:
    """A per-row vector (M,) zero-padded to the panels' rows."""
    padded = np.zeros(-(-bias.shape[0] // TILE_ROWS) * TILE_ROWS, np.float32)
    padded[: bias.shape[0]] = bias
    return padded


@njit(inline="always", nogil=True, cache=True)
def _block(panels, p, b, q, ldb, c, c_at, ldc, k, k0, k1, bias, mode, low, high, columns, residual):
    """Panel ``p`` times columns ``q .. q + columns`` of ``b`` into ``c`` from ``c_at`` on,
    over steps ``k0 .. k1`` of the ``k``: a whole tile, or a masked one for the last columns
    (a narrow one for at most ``LANES``). The first block of steps starts from the bias (and
    adds what ``c`` holds, where ``residual``), the others from what ``c`` holds; the
    activation is applied by the last."""
    at = (p * k + k0) * TILE_ROWS
    onto = np.int64(1) if k0 > 0 else np.int64(ONTO_BIAS) if residual else np.int64(0)
    act = mode if k1 == k else 0
    b_at, steps, bias_at = q + k0 * ldb, k1 - k0, p * TILE_ROWS
    ahead = np.int64(k * TILE_ROWS)  # the next panel's same steps
    if columns == TILE_COLUMNS:
        _tile(panels, at, b, b_at, ldb, c, c_at, ldc, steps, bias, bias_at, act, low, high, onto, ahead)
    elif columns <= LANES:
        _narrow_tile_part(
            panels, at, b, b_at, ldb, c, c_at, ldc, steps, bias, bias_at, act, low, high, onto, ahead, columns
        )
    else:
        _tile_part(
            panels, at, b, b_at, ldb, c, c_at, ldc, steps, bias, bias_at, act, low, high, onto, ahead, columns
        )


@njit(nogil=True, cache=True, no_cfunc_wrapper=True)  # type: ignore[call-overload]  # numba's stubs lack no_cfunc_wrapper
def gemm_panels(panels, bias, b, c, code, alpha, beta):
    """``c = activation(w @ b + bias)`` for the ``c.shape[0]`` rows of ``w`` packed in
    ``panels`` (:func:`pack_panels`); ``bias`` padded as by :func:`pad_rows`; ``b`` (K, N) and
    ``c`` (M, N) are float32 views with unit column stride."""
    _gemm_panels(panels, bias, b, c, c, False, code, alpha, beta)


@njit(nogil=True, cache=True, no_cfunc_wrapper=True)  # type: ignore[call-overload]  # numba's stubs lack no_cfunc_wrapper
def gemm_panels_onto(panels, bias, b, c, z, code, alpha, beta):
    """``c = activation(w @ b + bias + z)``: :func:`gemm_panels` with a residual ``z`` (a view
    of c's shape, unit column stride) added before the activation, as ONNX Runtime's
    FusedConv adds its Z. Each block of columns of ``z`` is copied into ``c`` just before its
    tiles start from it (``ONTO_BIAS``), while it is in L1."""
    _gemm_panels(panels, bias, b, c, z, True, code, alpha, beta)


@njit(inline="always", nogil=True, cache=True)
def _gemm_panels(panels, bias, b, c, z, residual, code, alpha, beta):
    """:func:`gemm_panels`, and with ``residual`` :func:`gemm_panels_onto`."""
    m, n = c.shape
    k = b.shape[0]
    if m == 0 or n == 0:
        return
    # Relu and Clip as the tiles store; another curve on the stored block
    mode = RELU_MODE if code == RELU else CLIP_MODE if code == CLIP else 0
    other = mode == 0 and code != NONE
    low, high = np.float32(alpha), np.float32(beta)
    ldb, ldc, ldz = leading_dimension(b), leading_dimension(c), leading_dimension(z)
    full_rows = m // TILE_ROWS
    scratch = np.empty((TILE_ROWS, TILE_COLUMNS), np.float32)
    # Steps of k in blocks that keep a block of b's columns in L1 while every panel reads it.
    depth = max(k, 1) if k <= DEPTH_MAX else -(-k // -(-k // DEPTH))
    # Another curve is applied a block of columns at a time, each block as soon as it is
    # stored, while it is in L2: over the whole of a large c, each row would come back from
    # memory (a 96 x 12544 Conv+Swish spent twice as long on the curve as on the GEMM).
    block = n if not other else max(TILE_COLUMNS, CURVE_BLOCK_FLOATS // m // TILE_COLUMNS * TILE_COLUMNS)
    # The residual is copied into c a span of columns at a time, whole runs of each row, which
    # the hardware prefetchers follow (a tile's 32 columns of each of M rows they did not:
    # ResNet-50's residual convs then took as long as a separate Add saved), while the span
    # stays in L2 for its tiles.
    span = max(TILE_COLUMNS, RESIDUAL_SPAN_FLOATS // max(m, 1) // TILE_COLUMNS * TILE_COLUMNS)
    for q0 in range(0, n, block):
        q1 = min(q0 + block, n)
        for q in range(q0, q1, TILE_COLUMNS):
            columns = min(TILE_COLUMNS, q1 - q)
            if residual and (q - q0) % span == 0:  # the residual into c, for the tiles to start from
                width = min(span, q1 - q)
                for i in range(m):
                    for j in range(0, width, LANES):
                        copy_floats(c, i * ldc + q + j, z, i * ldz + q + j, min(LANES, width - j))
            for k0 in range(0, max(k, 1), depth):  # an empty product: one block, the bias
                k1 = min(k, k0 + depth)
                for p in range(full_rows):
                    _block(
                        panels,
                        p,
                        b,
                        q,
                        ldb,
                        c,
                        p * TILE_ROWS * ldc + q,
                        ldc,
                        k,
                        k0,
                        k1,
                        bias,
                        mode,
                        low,
                        high,
                        columns,
                        residual,
                    )
            if full_rows * TILE_ROWS < m:  # the last panel's padding rows go to scratch
                if residual:
                    for i in range(m - full_rows * TILE_ROWS):
                        row = (full_rows * TILE_ROWS + i) * ldc + q
                        for j in range(0, columns, LANES):
                            copy_floats(scratch, i * TILE_COLUMNS + j, c, row + j, min(LANES, columns - j))
                _block(
                    panels,
                    full_rows,
                    b,
                    q,
                    ldb,
                    scratch,
                    0,
                    TILE_COLUMNS,
                    k,
                    0,
                    k,
                    bias,
                    mode,
                    low,
                    high,
                    columns,
                    residual,
                )
                # A loop, not a slice assignment: that compiles numba's formatted messages for
                # shapes that do not broadcast (seconds on a cold cache).
                for i in range(m - full_rows * TILE_ROWS):
                    for j in range(columns):
                        c[full_rows * TILE_ROWS + i, q + j] = scratch[i, j]
        if other:  # a row of the block per call: a call per tile row would cost more than the curve
            for i in range(m):
                activate_in_place(c[i, q0:q1], code, alpha, beta)


# The views gemm_panels multiplies when called by address from the conv slices.
_VIEW = types.Array(types.float32, 2, "A")
_panel_addresses: dict[tuple, int] = {}


def panels_address(panels: np.ndarray, bias: np.ndarray, residual: bool = False) -> int:
    """The address of :func:`gemm_panels` (with ``residual``, of :func:`gemm_panels_onto`,
    which takes a strided view for ``z`` after ``c``) for one group's panels of ``panels``
    (groups, ...) and of ``bias`` (groups, ...), strided (``A``) views for ``b`` and ``c``, an
    int64 code and float32 alpha and beta: what a kernel calls it with by address
    (``calls.call_native``), instead of linking it into its own code, compiled (or loaded
    from numba's cache) once."""
    key = (compute_fingerprint(panels), compute_fingerprint(bias), residual)  # numba.typeof's, faster
    found = _panel_addresses.get(key)
    if found is None:
        views = (_VIEW, _VIEW, _VIEW) if residual else (_VIEW, _VIEW)
        signature = (
            numba.typeof(panels[0]),
            numba.typeof(bias[0]),
            *views,
            types.int64,
            types.float32,
            types.float32,
        )
        function = gemm_panels_onto if residual else gemm_panels
        found = _panel_addresses[key] = native_address(function, signature)
    return found
