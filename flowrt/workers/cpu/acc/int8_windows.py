"""The int8 GEMM of a stride-1 conv with no column matrix (``kernels/qlinear.py``'s
``_windows``): row ``(c, i, j)`` of the product is a window of the conv's input padded with
its zero point (``conv/int8_layout.py``), read as rows of the padded width; each block of
columns is packed straight from those windows, and only the output's columns are stored.
Narrow outputs lay their rows end to end at the padded width (a block may span two rows),
wide ones each row on whole blocks (none spans two: only a row's last is stored apart).
The tiles and their packing are ``int8_gemm``'s.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from flowrt.workers.cpu.acc import cache_stamp
from flowrt.workers.cpu.acc.int8_gemm import INT16, _chunk, _tile
from flowrt.workers.cpu.acc.int8_tiles import (
    GROUP_BYTES,
    TILE_COLUMNS,
    TILE_ROWS,
    _interleave_bytes_at,
    _interleave_words_at,
)
from flowrt.workers.cpu.acc.kernels.pool_vectors import copy_row

cache_stamp.register()  # before this module jits anything: its functions cached as the package's


@njit(inline="always", nogil=True, cache=True)
def _pack_windows(x, offsets, q, columns, depth, packed):
    """:func:`_pack_columns` of the implicit matrix whose row ``k`` is ``x[offsets[k]:]``:
    columns ``q .. q + columns`` of each row are ``x[offsets[k] + q + j]``. A block of fewer
    columns is packed whole too (``x`` reaches a block past every row's end: the columns past
    ``columns`` are never stored)."""
    k = offsets.shape[0]
    steps = -(-k // depth)
    whole = k // depth
    for s in range(whole):
        if depth == 4:
            first = s * 4
            _interleave_bytes_at(
                x, offsets[first] + q, offsets[first + 1] + q, offsets[first + 2] + q, offsets[first + 3] + q,
                packed, s * GROUP_BYTES,
            )  # fmt: skip
        else:
            _interleave_words_at(x, offsets[s * 2] + q, offsets[s * 2 + 1] + q, packed, s * GROUP_BYTES)
    for b in range(whole * GROUP_BYTES, steps * GROUP_BYTES):
        packed[b] = 0
    width = 4 // depth  # bytes per value
    for s in range(whole, steps):
        for r in range(min(depth, k - s * depth)):
            at = offsets[s * depth + r] + q
            for j in range(columns):
                packed[s * GROUP_BYTES + j * 4 + r * width] = x[at + j]


@njit(nogil=True, cache=True)
def qgemm_windows(
    panels, kernel, m, x, offsets, pitch, block_pitch, out_w, n0, n1, bias, scale, out_zero_point, lo, hi, out
):
    """Columns ``[n0, n1)`` of the product of the weights by an implicit column matrix, each row
    ``k`` the window ``x[offsets[k]:]`` of a padded input (a stride-1 conv, ``pitch`` the padded
    width), requantized into ``out`` (M, OH * out_w) uint8. Virtual column ``n`` is output row
    ``n // block_pitch``, column ``n % block_pitch``, read at that row's ``pitch`` in ``x``; the
    columns past ``out_w`` are computed, not stored. ``block_pitch`` is ``pitch`` (a block of
    TILE_COLUMNS columns may span two output rows: narrow outputs use more of each block) or a
    multiple of TILE_COLUMNS (no block spans rows: wide ones store whole blocks in place but
    a row's last). No column matrix: each block is packed straight from ``x``, which must hold
    TILE_COLUMNS bytes past the end of the last window's last column. For the kernels of
    packed weights (not PORTABLE); nothing is checked."""
    if n1 <= n0 or m == 0:
        return
    zero, low, high = np.float32(out_zero_point), np.float32(lo), np.float32(hi)
    depth = 2 if kernel == INT16 else 4
    steps = -(-offsets.shape[0] // depth)
    row_bias, row_scale, block_bytes, chunk, packed, edge = _chunk(n0, n1, steps, m, bias, scale, out.dtype)
    for q0 in range(n0, n1, chunk * TILE_COLUMNS):
        q1 = min(n1, q0 + chunk * TILE_COLUMNS)
        for q in range(q0, q1, TILE_COLUMNS):
            at = (q - q0) // TILE_COLUMNS * block_bytes
            y, x_at = divmod(q, block_pitch)
            _pack_windows(
                x, offsets, y * pitch + x_at, min(TILE_COLUMNS, q1 - q), depth, packed[at : at + block_bytes]
            )
        ldo = out.strides[0]
        for r in range(0, m, TILE_ROWS):
            count = min(TILE_ROWS, m - r)
            for q in range(q0, q1, TILE_COLUMNS):
                at = (q - q0) // TILE_COLUMNS * block_bytes
                columns = min(TILE_COLUMNS, q1 - q)
                y, x_at = divmod(q, block_pitch)
                if count == TILE_ROWS and columns == TILE_COLUMNS and x_at + TILE_COLUMNS <= out_w:
                    _tile(
                        kernel, packed, at, panels, r, steps, row_bias, row_scale, zero, low, high, out,
                        r * ldo + y * out_w + x_at, ldo,
                    )  # fmt: skip  # the block within one output row: stored in place
                    continue
                _tile(
                    kernel, packed, at, panels, r, steps, row_bias, row_scale, zero, low, high, edge, 0,
                    TILE_COLUMNS,
                )  # fmt: skip
                j = 0
                while j < columns:  # the block's runs of output columns, row by row
                    y, x_at = divmod(q + j, block_pitch)
                    if x_at >= out_w:  # past the output row: on to the next
                        j += block_pitch - x_at
                        continue
                    run, column = min(out_w - x_at, columns - j), y * out_w + x_at
                    for i in range(count):
                        into, out_of = out[r + i], edge[i]
                        copy_row(into, column, out_of, j, run)
                    j += run
