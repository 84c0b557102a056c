"""An exact uint8 x int8 GEMM for weights packed once at load: ``acc = w @ x`` in int32, stored
requantized to uint8 (:func:`qgemm`, QLinearConv and QLinearMatMul) or as ``acc + bias`` in
int32 (:func:`igemm`, MatMulInteger and ConvInteger).

For a column range ``[n0, n1)`` of ``x`` (K, N) uint8 and the weights ``w`` (M, K) int8::

    acc[m, n] = sum_k int32(x[k, n]) * int32(w[m, k])
    out[m, n] = clip(rint(float32(acc[m, n] + bias[m]) * scale[m]) + zero_point, lo, hi)

all in float32 after the sum, rounding half to even, as numpy computes it. ``x`` is read in
place from its rows at any stride (a conv's column matrix, or a 1x1 conv's input (C, H * W));
``out`` (M, N) has the columns of ``x``, at any row stride, and only ``[n0, n1)`` of them
are written: workers split the columns between them. The caller folds the input's zero
point into ``bias`` (``bias - x_zp * row_sums(w)``).

Where the host has VNNI (:data:`VNNI_AVAILABLE`), the micro-kernel is ``vpdpbusd``: each
int32 lane of an accumulator adds the 4 products of its column's 4 bytes of k by the row's 4
broadcast bytes, exact for any weights (:data:`VNNI`). With AVX-512 its tile is 8 x 32 (16
zmm accumulators; ``int8_tiles.HOST_WIDE``, which sets TILE_ROWS and TILE_COLUMNS for every
kernel), else 4 x 16 of ymm. On one Zen 5 core, 770-840 GOPS on resnet50's 3x3 shapes where
the maddubs kernel below runs at 220-250. A product of at most FEW_COLUMNS columns (a
classifier's at batch 1) takes each column alone, by column tiles of 32 rows: the column's 4
bytes broadcast against a step of each of 4 panels (1000 x 1280 by one column: 50 -> 15 us).

Without VNNI the micro-kernels are the u8 x s8 kernels of x86 (onnxruntime's MLAS, oneDNN),
written in LLVM IR (``int8_tiles.py``) as ``tile_ir.py``'s are. A block of
``TILE_COLUMNS`` columns of ``x`` is packed, its k interleaved by 4, into a scratch buffer;
the weights are packed into panels of ``TILE_ROWS`` rows, the 4 bytes of consecutive k of a
row side by side. Per step, a row's 4 bytes broadcast, ``vpmaddubsw`` (x unsigned, w signed)
sums products in pairs to int16 and ``vpmaddwd`` by ones the pairs to int32. ``vpmaddubsw``
saturates where a pair leaves int16: exact only when every ``|w| <= 64`` (7-bit weights, as
quantize_static's ``reduce_range`` writes them). :func:`pack_weights` checks and otherwise
chooses the int16 kernel: ``x`` zero-extended to int16, k interleaved by 2, and ``vpmaddwd``
straight into int32. K is zero-padded to the interleave. The tile is 4 x 16 (8 ymm
accumulators; 6 x 16 and 4 x 24 ran no faster; on an AVX-512 host, where VNNI is chosen, the
8 x 32 of VNNI's); edge tiles go through a scratch tile.

On one Zen 4 core with AVX2 only, for convs of M=64-512, K=64-2304, N=196-3136, the maddubs
kernel runs at 130-165 GOPS and the int16 one at 110-140, where ``tile_ir.py``'s float32 6 x 16
tiles run at 50-80 GFLOP/s on the same shapes; the portable loops at about 30.

Without AVX2, or with ``FLOWRT_TILES=off`` (``tile_ir.AVAILABLE``), the weights are kept as
they are and plain loops multiply them (:data:`PORTABLE`). The kernel is chosen at pack time
and passed as a value, so numba's cache holds one code for every choice.
"""

from __future__ import annotations

import attrs
import numpy as np
from numba import njit

from flowrt.errors import BackendError
from flowrt.workers.cpu.acc import cache_stamp, tile_ir
from flowrt.workers.cpu.acc.int8_tiles import (
    COLUMN_PANELS,
    GROUP_BYTES,
    HOST_AVX2,
    HOST_VNNI,
    TILE_COLUMNS,
    TILE_ROWS,
    _int16_tile,
    _int16_tile_across,
    _interleave_bytes,
    _interleave_words,
    _maddubs_tile,
    _maddubs_tile_across,
    _vnni_column_panel,
    _vnni_column_tile,
    _vnni_tile,
    _vnni_tile_across,
)
from flowrt.workers.cpu.acc.kernels.pool_vectors import copy_row

cache_stamp.register()  # before this module jits anything: its functions cached as the package's

__all__ = [
    "INT16",
    "KERNEL_NAMES",
    "MADDUBS",
    "PORTABLE",
    "PackedInt8Weights",
    "igemm",
    "igemm_columns",
    "pack_weights",
    "qgemm",
    "qgemm_columns",
    "qgemm_rows",
    "row_sums",
]

# The micro-kernels (PackedInt8Weights.kernel): vpdpbusd where the host has VNNI, else
# vpmaddubsw for 7-bit weights and vpmaddwd for any; plain loops without AVX2.
MADDUBS, INT16, PORTABLE, VNNI = 0, 1, 2, 3
KERNEL_NAMES = {MADDUBS: "maddubs", INT16: "int16", PORTABLE: "portable", VNNI: "vnni"}
AVAILABLE = tile_ir.AVAILABLE and HOST_AVX2
VNNI_AVAILABLE = AVAILABLE and HOST_VNNI
SEVEN_BITS = 64  # the largest |w| of which vpmaddubsw's pair sums stay in int16 (2 * 255 * 64)


def _l2_bytes(path: str = "/sys/devices/system/cpu/cpu0/cache/index2/size") -> int:
    """A core's L2 as Linux reports it ("1024K"), or 1 MiB where it does not say."""
    try:
        with open(path) as f:
            text = f.read().strip()
        return int(text[:-1]) * {"K": 1 << 10, "M": 1 << 20}[text[-1]] if text[-1] in "KM" else int(text)
    except (OSError, ValueError, IndexError):
        return 1 << 20


# Packed columns multiplied by each panel of weights in turn: half a core's L2. A layer's
# weights stream from memory once per chunk: resnet50's 3x3 convs at 7x7 (49 columns, 2.4 MB
# of weights) took 420 us from memory with 256 KB chunks (twice), 330 with 512 KB (once).
CHUNK_BYTES = _l2_bytes() // 2
PORTABLE_COLUMNS = 512  # columns summed at once by the portable loops (their int32 row in L1)


@attrs.frozen(eq=False)
class PackedInt8Weights:
    """Int8 weights (M, K) packed for :func:`qgemm` and :func:`igemm` by :func:`pack_weights`.

    ``panels`` is flat int8: for MADDUBS and INT16, ceil(M / TILE_ROWS) panels of
    ``padded_k / depth`` steps of TILE_ROWS rows of 4 bytes (4 int8, or 2 int16); for PORTABLE
    the weights (M, K) row-major. ``row_sums`` are the rows' sums (int32, (M,)), to fold the
    input's zero point into the bias."""

    panels: np.ndarray
    m: int
    k: int
    padded_k: int
    kernel: int
    row_sums: np.ndarray


def row_sums(w: np.ndarray) -> np.ndarray:
    """The sum of each row of int8 ``w`` (M, K), as int32 (M,)."""
    return w.sum(axis=1, dtype=np.int32)


def pack_weights(w: np.ndarray) -> PackedInt8Weights:
    """``w`` int8 (M, K) packed once, for the VNNI kernel where the host has it, else the
    maddubs kernel when every ``|w| <= 64``, else the int16 one, or the portable loops without
    AVX2 (see the module doc)."""
    if not isinstance(w, np.ndarray) or w.dtype != np.int8 or w.ndim != 2:
        found = f"{w.dtype} {w.shape}" if isinstance(w, np.ndarray) else type(w).__name__
        raise BackendError(f"int8 GEMM weights: expected a 2-D int8 array, got {found}")
    m, k = w.shape
    sums = row_sums(w)
    if not AVAILABLE:
        panels = np.array(w, order="C").reshape(-1)  # a copy: read-only below, not the caller's
        return _frozen(PackedInt8Weights(panels, m, k, k, PORTABLE, sums))
    seven_bits = w.size == 0 or (int(w.min()) >= -SEVEN_BITS and int(w.max()) <= SEVEN_BITS)
    kernel = VNNI if VNNI_AVAILABLE else MADDUBS if seven_bits else INT16
    depth = 2 if kernel == INT16 else 4
    padded_k = -(-k // depth) * depth
    rows = -(-m // TILE_ROWS) * TILE_ROWS
    padded = np.zeros((rows, padded_k), np.int16 if kernel == INT16 else np.int8)
    padded[:m, :k] = w
    # (panel, row, step, k of the step) -> (panel, step, row, k of the step): a step's rows side by side
    steps = padded.reshape(rows // TILE_ROWS, TILE_ROWS, padded_k // depth, depth).transpose(0, 2, 1, 3)
    panels = np.ascontiguousarray(steps).view(np.int8).reshape(-1)  # int16 as its (little-endian) bytes
    return _frozen(PackedInt8Weights(panels, m, k, padded_k, kernel, sums))


def _frozen(packed: PackedInt8Weights) -> PackedInt8Weights:
    """``packed`` with its arrays read-only: a form of a layer's constants, shared by its loads
    (and not counted as a buffer its recorded launches keep alive, ``launches._kept_bytes``)."""
    packed.panels.flags.writeable = False
    packed.row_sums.flags.writeable = False
    return packed


@njit(inline="always", nogil=True, cache=True)
def _pack_columns(x, q, columns, depth, packed):
    """Columns ``q .. q + columns`` of ``x`` as steps of ``depth`` k (the layout of
    :func:`_interleave_bytes` or :func:`_interleave_words`), zero-padded to the full block and
    to a whole last step."""
    k = x.shape[0]
    steps = -(-k // depth)
    ldx = x.strides[0]
    whole = k // depth
    if columns < TILE_COLUMNS:
        # A block of fewer columns is read whole all the same where the array's bytes go on
        # that far: the columns past its end land in the tile's columns that are not stored
        # (each column of a product is its own column's alone).
        readable = (k - 1) * ldx + x.shape[1] - q - TILE_COLUMNS - (depth - 1) * ldx
        whole = min(whole, max(0, readable // (depth * ldx) + 1)) if readable >= 0 else 0
    for s in range(whole):
        if depth == 4:
            _interleave_bytes(x, s * 4 * ldx + q, ldx, packed, s * GROUP_BYTES)
        else:
            _interleave_words(x, s * 2 * ldx + q, ldx, packed, s * GROUP_BYTES)
    # The last rows (fewer than a step, or the last steps of a short block), a byte at a time.
    # Loops, not slice assignments: those compile numba's messages for shapes that do not broadcast.
    for b in range(whole * GROUP_BYTES, steps * GROUP_BYTES):
        packed[b] = 0
    width = 4 // depth  # bytes per value
    for s in range(whole, steps):
        for r in range(min(depth, k - s * depth)):
            for j in range(columns):
                packed[s * GROUP_BYTES + j * 4 + r * width] = x[s * depth + r, q + j]


@njit(inline="always", nogil=True, cache=True)
def _pack_rows(xt, q, columns, depth, packed):
    """:func:`_pack_columns` from ``xt`` (N, K), ``x`` transposed: a column's k are a row's
    bytes, so a step of a column is ``depth`` consecutive bytes (a 4-byte word for maddubs)."""
    k = xt.shape[1]
    steps = -(-k // depth)
    whole = k // depth
    for b in range(steps * GROUP_BYTES):
        packed[b] = 0
    for j in range(columns):
        row = xt[q + j]
        if depth == 4:
            for s in range(whole):
                at = s * GROUP_BYTES + j * 4
                for r in range(4):
                    packed[at + r] = row[s * 4 + r]
        else:  # int16 pairs: each byte zero-extended
            for s in range(whole):
                at = s * GROUP_BYTES + j * 4
                packed[at] = row[s * 2]
                packed[at + 2] = row[s * 2 + 1]
        width = 4 // depth
        for p in range(whole * depth, k):  # the last, partial step
            packed[(p // depth) * GROUP_BYTES + j * 4 + (p % depth) * width] = row[p]


@njit(nogil=True, cache=True)
def _portable_columns(w, m, x, n0, n1, bias, scale, zero, low, high, out):
    """:func:`_columns` by plain loops (``w`` the weights (M, K) flat), int32 sums of
    PORTABLE_COLUMNS columns at a time."""
    k = x.shape[0]
    sums = np.empty(PORTABLE_COLUMNS, np.int32)
    for q in range(n0, n1, PORTABLE_COLUMNS):
        columns = min(PORTABLE_COLUMNS, n1 - q)
        for i in range(m):
            for j in range(columns):
                sums[j] = bias[i]
            for p in range(k):
                weight = np.int32(w[i * k + p])
                row = x[p, q : q + columns]
                for j in range(columns):
                    sums[j] += np.int32(row[j]) * weight
            if out.itemsize == 1:  # requantize (uint8 out), as the tiles do
                for j in range(columns):
                    value = np.rint(np.float32(sums[j]) * scale[i]) + zero
                    out[i, q + j] = np.uint8(min(max(value, low), high))
            else:
                for j in range(columns):
                    out[i, q + j] = sums[j]


@njit(inline="always", nogil=True, cache=True)
def _tile(kernel, packed, x_at, panels, r, steps, bias, scale, zero, low, high, out, out_at, ldo):
    """Rows ``r .. r + TILE_ROWS`` (a panel) by the block of columns packed at ``x_at``, by
    ``kernel``'s tile."""
    w_at = r * steps * 4
    if kernel == VNNI:
        _vnni_tile(packed, x_at, panels, w_at, steps, bias, scale, r, zero, low, high, out, out_at, ldo)
    elif kernel == MADDUBS:
        _maddubs_tile(packed, x_at, panels, w_at, steps, bias, scale, r, zero, low, high, out, out_at, ldo)
    else:
        _int16_tile(packed, x_at, panels, w_at, steps, bias, scale, r, zero, low, high, out, out_at, ldo)


@njit(inline="always", nogil=True, cache=True)
def _panel_rows(m, bias, scale):
    """``bias`` (int32) and ``scale`` (float32) of the ``m`` rows, zero-padded to whole panels."""
    rows = -(-m // TILE_ROWS) * TILE_ROWS
    row_bias, row_scale = np.zeros(rows, np.int32), np.zeros(rows, np.float32)
    for i in range(m):
        row_bias[i], row_scale[i] = bias[i], scale[i]
    return row_bias, row_scale


@njit(inline="always", nogil=True, cache=True)
def _chunk(n0, n1, steps, m, bias, scale, out_dtype):
    """What a product of columns ``[n0, n1)`` over ``steps`` steps of k works in: (the rows'
    bias and scale padded to whole panels, bytes of a packed block, blocks per chunk, the
    chunk's packed scratch, an edge tile of ``out_dtype``). Blocks of columns are packed a
    chunk at once, then each panel of weights multiplied by all of them: the weights stream
    from memory once per chunk (once for a late layer's few pixels), the packed blocks stay
    in L2 (CHUNK_BYTES)."""
    row_bias, row_scale = _panel_rows(m, bias, scale)
    block_bytes = steps * GROUP_BYTES
    chunk = max(1, min(-(-(n1 - n0) // TILE_COLUMNS), CHUNK_BYTES // max(1, block_bytes)))
    packed = np.empty(chunk * block_bytes, np.uint8)
    edge = np.empty((TILE_ROWS, TILE_COLUMNS), out_dtype)
    return row_bias, row_scale, block_bytes, chunk, packed, edge


# Columns at most that the VNNI kernel multiplies one at a time (``_few_columns``) rather than
# by tiles of TILE_COLUMNS columns, of which a classifier at batch 1 uses one.
FEW_COLUMNS = 4


@njit(nogil=True, cache=True)
def _few_columns(panels, m, x, n0, n1, bias, scale, zero, low, high, out, transposed):
    """:func:`_columns` of the VNNI kernel into uint8 ``out``, a column at a time: each column's
    bytes copied out (zero-padded to whole steps), then COLUMN_PANELS panels of weights at once
    by it (``int8_tiles._vnni_column_tile``)."""
    k = x.shape[1] if transposed else x.shape[0]
    steps = -(-k // 4)
    row_bias, row_scale = _panel_rows(m, bias, scale)
    rows = row_bias.shape[0]
    panel_bytes = steps * 4 * TILE_ROWS
    column = np.zeros(steps * 4, np.uint8)
    result = np.empty(rows, np.uint8)
    for n in range(n0, n1):
        for p in range(k):
            column[p] = x[n, p] if transposed else x[p, n]
        r = 0
        while r + COLUMN_PANELS * TILE_ROWS <= rows:
            _vnni_column_tile(
                column, 0, panels, r * steps * 4, panel_bytes, steps, row_bias, row_scale, r, zero, low, high,
                result, r,
            )  # fmt: skip
            r += COLUMN_PANELS * TILE_ROWS
        while r < rows:
            _vnni_column_panel(
                column, 0, panels, r * steps * 4, panel_bytes, steps, row_bias, row_scale, r, zero, low, high,
                result, r,
            )  # fmt: skip
            r += TILE_ROWS
        for i in range(m):
            if transposed:
                out[n, i] = result[i]
            else:
                out[i, n] = result[i]


@njit(nogil=True, cache=True)
def _columns(panels, kernel, m, x, n0, n1, bias, scale, zero, low, high, out, transposed):
    """Columns ``[n0, n1)`` of ``out`` = the product, requantized (uint8 ``out``) or not
    (int32); ``zero``, ``low``, ``high`` float32. ``transposed``: ``x`` is given as (N, K) and
    ``out`` as (N, M), each column a row."""
    if n1 <= n0 or m == 0:
        return
    if kernel == PORTABLE:
        if transposed:
            product = np.empty((m, n1 - n0), out.dtype)
            _portable_columns(panels, m, x[n0:n1].T.copy(), 0, n1 - n0, bias, scale, zero, low, high, product)
            out[n0:n1, :m] = product.T
        else:
            _portable_columns(panels, m, x, n0, n1, bias, scale, zero, low, high, out)
        return
    if kernel == VNNI and n1 - n0 <= FEW_COLUMNS and out.itemsize == 1:
        _few_columns(panels, m, x, n0, n1, bias, scale, zero, low, high, out, transposed)
        return
    depth = 2 if kernel == INT16 else 4
    steps = -(-(x.shape[1] if transposed else x.shape[0]) // depth)
    ldo = out.strides[0] // out.itemsize
    row_bias, row_scale, block_bytes, chunk, packed, edge = _chunk(n0, n1, steps, m, bias, scale, out.dtype)
    for q0 in range(n0, n1, chunk * TILE_COLUMNS):
        q1 = min(n1, q0 + chunk * TILE_COLUMNS)
        for q in range(q0, q1, TILE_COLUMNS):
            at = (q - q0) // TILE_COLUMNS * block_bytes
            if transposed:
                _pack_rows(x, q, min(TILE_COLUMNS, q1 - q), depth, packed[at : at + block_bytes])
            else:
                _pack_columns(x, q, min(TILE_COLUMNS, q1 - q), depth, packed[at : at + block_bytes])
        for r in range(0, m, TILE_ROWS):
            for q in range(q0, q1, TILE_COLUMNS):
                at = (q - q0) // TILE_COLUMNS * block_bytes
                columns = min(TILE_COLUMNS, q1 - q)
                if r + TILE_ROWS <= m and columns == TILE_COLUMNS and transposed and out.itemsize == 1:
                    w_at = r * steps * 4
                    if kernel == VNNI:
                        _vnni_tile_across(
                            packed, at, panels, w_at, steps, row_bias, row_scale, r, zero, low, high, out,
                            q * ldo + r, ldo,
                        )  # fmt: skip
                    elif kernel == MADDUBS:
                        _maddubs_tile_across(
                            packed, at, panels, w_at, steps, row_bias, row_scale, r, zero, low, high, out,
                            q * ldo + r, ldo,
                        )  # fmt: skip
                    else:
                        _int16_tile_across(
                            packed, at, panels, w_at, steps, row_bias, row_scale, r, zero, low, high, out,
                            q * ldo + r, ldo,
                        )  # fmt: skip
                    continue
                if r + TILE_ROWS <= m and columns == TILE_COLUMNS and not transposed:
                    _tile(
                        kernel, packed, at, panels, r, steps, row_bias, row_scale, zero, low, high, out,
                        r * ldo + q, ldo,
                    )  # fmt: skip
                    continue
                _tile(
                    kernel, packed, at, panels, r, steps, row_bias, row_scale, zero, low, high, edge, 0,
                    TILE_COLUMNS,
                )  # fmt: skip
                if transposed:  # a tile's 64 values stored across: small beside its K / 4 steps
                    for j in range(columns):
                        for i in range(min(TILE_ROWS, m - r)):
                            out[q + j, r + i] = edge[i, j]
                    continue
                for i in range(min(TILE_ROWS, m - r)):
                    if out.itemsize == 1 and out.strides[1] == 1:  # a row of bytes
                        copy_row(out[r + i], q, edge[i], 0, columns)
                        continue
                    for j in range(columns):
                        out[r + i, q + j] = edge[i, j]


@njit(nogil=True, cache=True)
def qgemm_columns(panels, kernel, m, x, n0, n1, bias, scale, out_zero_point, lo, hi, out):
    """:func:`qgemm` for numba callers, on a :class:`PackedInt8Weights`' ``panels``,
    ``kernel`` and ``m``; nothing is checked (``x`` (K, N) uint8 and ``out`` (M, N) uint8 with
    unit column stride, ``bias`` int32 and ``scale`` float32 (M,), ints ``0 <= lo <= hi <= 255``)."""
    zero, low, high = np.float32(out_zero_point), np.float32(lo), np.float32(hi)
    _columns(panels, kernel, m, x, n0, n1, bias, scale, zero, low, high, out, False)


@njit(nogil=True, cache=True)
def qgemm_rows(panels, kernel, m, xt, n0, n1, bias, scale, out_zero_point, lo, hi, out):
    """:func:`qgemm_columns` with both operands the other way round: ``xt`` (N, K) uint8 and
    ``out`` (N, M) uint8, C-contiguous rows, rows ``[n0, n1)`` of ``out`` written (a MatMul
    ``a @ w`` as ``(w^T @ a^T)^T``, with no transposed copies)."""
    zero, low, high = np.float32(out_zero_point), np.float32(lo), np.float32(hi)
    _columns(panels, kernel, m, xt, n0, n1, bias, scale, zero, low, high, out, True)


@njit(nogil=True, cache=True)
def igemm_columns(panels, kernel, m, x, n0, n1, bias, out):
    """:func:`igemm` for numba callers: :func:`qgemm_columns` with an int32 ``out`` (M, N)."""
    scale = np.zeros(m, np.float32)  # not read: int32 tiles store acc + bias
    zero = np.float32(0)
    _columns(panels, kernel, m, x, n0, n1, bias, scale, zero, zero, zero, out, False)


def _check(packed, x, n0: int, n1: int, bias, out, out_dtype) -> None:
    """BackendError unless the operands are what the GEMM reads (see :func:`qgemm`)."""

    def found(a) -> str:
        return f"{a.dtype} {a.shape}" if isinstance(a, np.ndarray) else type(a).__name__

    if not isinstance(packed, PackedInt8Weights):
        raise BackendError(
            f"int8 GEMM: expected PackedInt8Weights (pack_weights), got {type(packed).__name__}"
        )
    m, k = packed.m, packed.k
    if not isinstance(x, np.ndarray) or x.dtype != np.uint8 or x.ndim != 2 or x.shape[0] != k:
        raise BackendError(f"int8 GEMM: expected x uint8 ({k}, N), got {found(x)}")
    n = x.shape[1]
    wanted = np.dtype(out_dtype)
    if not isinstance(out, np.ndarray) or out.dtype != wanted or out.shape != (m, n):
        raise BackendError(f"int8 GEMM: expected out {wanted} {(m, n)}, got {found(out)}")
    for name, a in (("x", x), ("out", out)):
        if a.size and a.shape[1] > 1 and a.strides[1] != a.itemsize:  # an empty one reads nothing
            raise BackendError(f"int8 GEMM: expected {name} with unit column stride, got strides {a.strides}")
    if not out.flags.writeable:
        raise BackendError("int8 GEMM: expected a writeable out, got a read-only array")
    if not 0 <= n0 <= n1 <= n:
        raise BackendError(f"int8 GEMM: expected columns 0 <= n0 <= n1 <= {n}, got [{n0}, {n1})")
    if not isinstance(bias, np.ndarray) or bias.dtype != np.int32 or bias.shape != (m,):
        raise BackendError(f"int8 GEMM: expected bias int32 ({m},), got {found(bias)}")


def qgemm(packed, x, n0, n1, bias, scale, out_zero_point, lo, hi, out) -> None:
    """Columns ``[n0, n1)`` of ``out`` (M, N) uint8 = ``clip(rint(float32(w @ x + bias) *
    scale) + out_zero_point, lo, hi)`` (see the module doc): ``x`` (K, N) uint8, ``bias``
    int32 and ``scale`` float32 (M,), ``0 <= lo <= hi <= 255``. Runs on the calling thread."""
    _check(packed, x, n0, n1, bias, out, np.uint8)
    if not isinstance(scale, np.ndarray) or scale.dtype != np.float32 or scale.shape != (packed.m,):
        found = f"{scale.dtype} {scale.shape}" if isinstance(scale, np.ndarray) else type(scale).__name__
        raise BackendError(f"int8 GEMM: expected scale float32 ({packed.m},), got {found}")
    if not 0 <= lo <= hi <= 255:
        raise BackendError(f"int8 GEMM: expected bounds 0 <= lo <= hi <= 255, got lo={lo}, hi={hi}")
    qgemm_columns(
        packed.panels, packed.kernel, packed.m, x, int(n0), int(n1), bias, scale, int(out_zero_point), int(lo),
        int(hi), out,
    )  # fmt: skip


def igemm(packed, x, n0, n1, bias, out_int32) -> None:
    """Columns ``[n0, n1)`` of ``out_int32`` (M, N) = ``w @ x + bias``, exact (int32, wrapping
    as int32 does), ``x`` (K, N) uint8, ``bias`` int32 (M,). Runs on the calling thread."""
    _check(packed, x, n0, n1, bias, out_int32, np.int32)
    igemm_columns(packed.panels, packed.kernel, packed.m, x, int(n0), int(n1), bias, out_int32)
