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

The micro-kernels are the u8 x s8 kernels of x86 without VNNI (onnxruntime's MLAS, oneDNN),
written in LLVM IR through numba's ``intrinsic`` as ``tiles.py`` is. A block of
``TILE_COLUMNS`` columns of ``x`` is packed, its k interleaved by 4, into a scratch buffer;
the weights are packed into panels of ``TILE_ROWS`` rows, the 4 bytes of consecutive k of a
row side by side. Per step, a row's 4 bytes broadcast, ``vpmaddubsw`` (x unsigned, w signed)
sums products in pairs to int16 and ``vpmaddwd`` by ones the pairs to int32. ``vpmaddubsw``
saturates where a pair leaves int16: exact only when every ``|w| <= 64`` (7-bit weights, as
quantize_static's ``reduce_range`` writes them). :func:`pack_weights` checks and otherwise
chooses the int16 kernel: ``x`` zero-extended to int16, k interleaved by 2, and ``vpmaddwd``
straight into int32. K is zero-padded to the interleave. The tile is 4 x 16 (8 ymm
accumulators; 6 x 16 and 4 x 24 ran no faster); edge tiles go through a scratch tile.

On one Zen 4 core with AVX2 only, for convs of M=64-512, K=64-2304, N=196-3136, the maddubs
kernel runs at 130-165 GOPS and the int16 one at 110-140, where ``tiles.py``'s float32 6 x 16
tiles run at 50-80 GFLOP/s on the same shapes; the portable loops at about 30.

Without AVX2, or with ``FLOWRT_TILES=off`` (``tiles.AVAILABLE``), the weights are kept as
they are and plain loops multiply them (:data:`PORTABLE`). The kernel is chosen at pack time
and passed as a value, so numba's cache holds one code for every choice.
"""

from __future__ import annotations

import attrs
import llvmlite.binding as llvm
import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.core.extending import intrinsic

from flowrt.errors import BackendError
from flowrt.workers.cpu.acc import tiles
from flowrt.workers.cpu.acc.tiles import _intrinsic_function

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

# The micro-kernels (PackedInt8Weights.kernel): vpmaddubsw for 7-bit weights, vpmaddwd for any,
# plain loops without AVX2.
MADDUBS, INT16, PORTABLE = 0, 1, 2
KERNEL_NAMES = {MADDUBS: "maddubs", INT16: "int16", PORTABLE: "portable"}
# Without AVX2 the x86 intrinsics would not compile: the tiles then emit nothing, and are never
# called (pack_weights chooses PORTABLE).
_HOST_AVX2 = bool(llvm.get_host_cpu_features().get("avx2"))
AVAILABLE = tiles.AVAILABLE and _HOST_AVX2
TILE_ROWS = 4
_VECTORS = 2  # vectors of 8 int32 columns per tile row
TILE_COLUMNS = 8 * _VECTORS
# Bytes of packed x per step of k (4 k of 16 columns of bytes, or 2 k of 16 columns of int16).
GROUP_BYTES = 4 * TILE_COLUMNS
SEVEN_BITS = 64  # the largest |w| of which vpmaddubsw's pair sums stay in int16 (2 * 255 * 64)
CHUNK_BYTES = 256 * 1024  # packed columns multiplied by each panel in turn: half an L2
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
    """``w`` int8 (M, K) packed once, for the maddubs kernel when every ``|w| <= 64``, else the
    int16 one, or the portable loops without AVX2 (see the module doc)."""
    if not isinstance(w, np.ndarray) or w.dtype != np.int8 or w.ndim != 2:
        found = f"{w.dtype} {w.shape}" if isinstance(w, np.ndarray) else type(w).__name__
        raise BackendError(f"int8 GEMM weights: expected a 2-D int8 array, got {found}")
    m, k = w.shape
    sums = row_sums(w)
    if not AVAILABLE:
        panels = np.ascontiguousarray(w).reshape(-1)
        return PackedInt8Weights(panels, m, k, k, PORTABLE, sums)
    seven_bits = w.size == 0 or (int(w.min()) >= -SEVEN_BITS and int(w.max()) <= SEVEN_BITS)
    kernel = MADDUBS if seven_bits else INT16
    depth = 4 if kernel == MADDUBS else 2
    padded_k = -(-k // depth) * depth
    rows = -(-m // TILE_ROWS) * TILE_ROWS
    padded = np.zeros((rows, padded_k), np.int8 if kernel == MADDUBS else np.int16)
    padded[:m, :k] = w
    # (panel, row, step, k of the step) -> (panel, step, row, k of the step): a step's rows side by side
    steps = padded.reshape(rows // TILE_ROWS, TILE_ROWS, padded_k // depth, depth).transpose(0, 2, 1, 3)
    panels = np.ascontiguousarray(steps).view(np.int8).reshape(-1)  # int16 as its (little-endian) bytes
    return PackedInt8Weights(panels, m, k, padded_k, kernel, sums)


def _array_pointer(context, builder, array_type, array, offset):
    """The address of element ``offset`` of a numba array."""
    return builder.gep(context.make_array(array_type)(context, builder, array).data, [offset])


def _emit_interleave(context, builder, signature, args, depth: int):
    """The IR of :func:`_interleave_bytes` (``depth`` 4) or :func:`_interleave_words` (2)."""
    x, x_at, ldx, packed, packed_at = args
    i8, i16, i64 = ir.IntType(8), ir.IntType(16), ir.IntType(64)
    source = _array_pointer(context, builder, signature.args[0], x, x_at)
    row_type = ir.VectorType(i8, TILE_COLUMNS)
    rows = [
        builder.load(
            builder.bitcast(
                builder.gep(source, [builder.mul(ir.Constant(i64, r), ldx)]), row_type.as_pointer()
            ),
            align=1,
        )
        for r in range(depth)
    ]

    def zip_(a, b, lanes):  # a[0], b[0], a[1], b[1], ...
        mask = ir.Constant(
            ir.VectorType(ir.IntType(32), 2 * lanes), [j // 2 + (j % 2) * lanes for j in range(2 * lanes)]
        )
        return builder.shuffle_vector(a, b, mask)

    if depth == 4:
        words = ir.VectorType(i16, TILE_COLUMNS)
        low, high = (builder.bitcast(zip_(rows[r], rows[r + 1], TILE_COLUMNS), words) for r in (0, 2))
        value = zip_(low, high, TILE_COLUMNS)
    else:
        wide = [builder.zext(row, ir.VectorType(i16, TILE_COLUMNS)) for row in rows]
        value = zip_(wide[0], wide[1], TILE_COLUMNS)
    target = _array_pointer(context, builder, signature.args[3], packed, packed_at)
    builder.store(value, builder.bitcast(target, value.type.as_pointer()), align=1)
    return context.get_dummy_value()


@intrinsic
def _interleave_bytes(typingctx, x, x_at, ldx, packed, packed_at):
    """``packed[packed_at + 4*j + r] = x[x_at + r*ldx + j]`` for ``r < 4``, ``j < TILE_COLUMNS``
    (uint8 arrays, offsets in elements): a step of 4 k of a block of columns, each column's 4
    bytes side by side."""
    sig = types.void(x, x_at, ldx, packed, packed_at)
    return sig, lambda context, builder, signature, args: _emit_interleave(
        context, builder, signature, args, 4
    )


@intrinsic
def _interleave_words(typingctx, x, x_at, ldx, packed, packed_at):
    """:func:`_interleave_bytes` for the int16 kernel: 2 k, each byte zero-extended to int16
    (``packed`` bytes ``packed_at + 4*j + 2*r`` and the zero after it)."""
    sig = types.void(x, x_at, ldx, packed, packed_at)
    return sig, lambda context, builder, signature, args: _emit_interleave(
        context, builder, signature, args, 2
    )


def _emit_tile(context, builder, signature, args, pairs: bool, across: bool = False):
    """The IR of :func:`_maddubs_tile` (``pairs`` False) or :func:`_int16_tile`; ``across``:
    of :func:`_maddubs_tile_across` or :func:`_int16_tile_across`."""
    if not _HOST_AVX2:  # never called there (see _HOST_AVX2)
        return context.get_dummy_value()
    packed, packed_at, w, w_at, steps, bias, scale, row_at, zero, low, high, out, out_at, ldo = args
    i8, i16, i32, i64, f32 = ir.IntType(8), ir.IntType(16), ir.IntType(32), ir.IntType(64), ir.FloatType()
    lanes = 8
    accumulator, floats = ir.VectorType(i32, lanes), ir.VectorType(f32, lanes)
    operand = ir.VectorType(i16, 16) if pairs else ir.VectorType(i8, 32)
    words = ir.VectorType(i16, 16)
    x_ptr = _array_pointer(context, builder, signature.args[0], packed, packed_at)
    w_ptr = _array_pointer(context, builder, signature.args[2], w, w_at)
    bias_ptr = _array_pointer(context, builder, signature.args[5], bias, row_at)
    scale_ptr = _array_pointer(context, builder, signature.args[6], scale, row_at)
    out_ptr = _array_pointer(context, builder, signature.args[11], out, out_at)
    maddubs = _intrinsic_function(builder, "llvm.x86.avx2.pmadd.ub.sw", words, [operand, operand])
    maddwd = _intrinsic_function(builder, "llvm.x86.avx2.pmadd.wd", accumulator, [words, words])
    ones = ir.Constant(words, [1] * 16)

    def broadcast(value, vector_type):
        one = builder.insert_element(ir.Constant(vector_type, ir.Undefined), value, ir.Constant(i32, 0))
        return builder.shuffle_vector(
            one, ir.Constant(vector_type, ir.Undefined), ir.Constant(accumulator, [0] * lanes)
        )

    def at(ptr, offset, pointee):
        return builder.bitcast(builder.gep(ptr, [offset]), pointee.as_pointer())

    zeros = ir.Constant(accumulator, [0] * lanes)
    entry = builder.block
    loop, done = builder.append_basic_block("int8.loop"), builder.append_basic_block("int8.done")
    builder.cbranch(builder.icmp_signed(">", steps, ir.Constant(i64, 0)), loop, done)

    builder.position_at_end(loop)
    step = builder.phi(i64)
    sums = [[builder.phi(accumulator) for _ in range(_VECTORS)] for _ in range(TILE_ROWS)]
    x_step = builder.mul(step, ir.Constant(i64, GROUP_BYTES))
    xs = [
        builder.load(at(x_ptr, builder.add(x_step, ir.Constant(i64, 32 * v)), operand), align=1)
        for v in range(_VECTORS)
    ]
    w_step = builder.mul(step, ir.Constant(i64, 4 * TILE_ROWS))
    updated = []
    for i in range(TILE_ROWS):
        word = builder.load(at(w_ptr, builder.add(w_step, ir.Constant(i64, 4 * i)), i32), align=1)
        weights = builder.bitcast(broadcast(word, accumulator), operand)
        row = []
        for v in range(_VECTORS):
            if pairs:
                product = builder.call(maddwd, [xs[v], weights])
            else:
                product = builder.call(maddwd, [builder.call(maddubs, [xs[v], weights]), ones])
            row.append(builder.add(sums[i][v], product))
        updated.append(row)
    following = builder.add(step, ir.Constant(i64, 1))
    tail = builder.block
    step.add_incoming(ir.Constant(i64, 0), entry)
    step.add_incoming(following, tail)
    for i in range(TILE_ROWS):
        for v in range(_VECTORS):
            sums[i][v].add_incoming(zeros, entry)
            sums[i][v].add_incoming(updated[i][v], tail)
    builder.cbranch(builder.icmp_signed("<", following, steps), loop, done)

    builder.position_at_end(done)
    totals = []
    for i in range(TILE_ROWS):
        for v in range(_VECTORS):
            total = builder.phi(accumulator)
            total.add_incoming(zeros, entry)
            total.add_incoming(updated[i][v], tail)
            totals.append(total)
    requantize = signature.args[11].dtype == types.uint8  # else int32: acc + bias as it is
    roundeven = _intrinsic_function(builder, "llvm.roundeven.v8f32", floats, [floats])
    zeros_f, lows, highs = (broadcast(value, floats) for value in (zero, low, high))
    if across:
        _store_across(builder, totals, bias_ptr, scale_ptr, out_ptr, ldo, zero, low, high, broadcast)
        return context.get_dummy_value()
    for i in range(TILE_ROWS):
        row_bias = broadcast(builder.load(builder.gep(bias_ptr, [ir.Constant(i64, i)])), accumulator)
        row_scale = broadcast(builder.load(builder.gep(scale_ptr, [ir.Constant(i64, i)])), floats)
        row_ptr = builder.gep(out_ptr, [builder.mul(ir.Constant(i64, i), ldo)])
        for v in range(_VECTORS):
            total = totals[i * _VECTORS + v]
            total = builder.add(total, row_bias)
            place = builder.gep(row_ptr, [ir.Constant(i64, lanes * v)])
            if not requantize:
                builder.store(total, builder.bitcast(place, accumulator.as_pointer()), align=1)
                continue
            value = builder.call(roundeven, [builder.fmul(builder.sitofp(total, floats), row_scale)])
            value = builder.fadd(value, zeros_f)
            # as np.clip, but NaN (an infinite scale) -> lo rather than a poison value
            value = builder.select(builder.fcmp_unordered("<", value, lows), lows, value)
            value = builder.select(builder.fcmp_ordered(">", value, highs), highs, value)
            stored = builder.trunc(builder.fptosi(value, accumulator), ir.VectorType(i8, lanes))
            builder.store(stored, builder.bitcast(place, stored.type.as_pointer()), align=1)
    return context.get_dummy_value()


def _store_across(builder, totals, bias_ptr, scale_ptr, out_ptr, ldo, zero, low, high, broadcast) -> None:
    """A tile's requantized values stored the other way round: its TILE_ROWS bytes of a
    column are 4 consecutive bytes of the output's row for that column (one 32-bit store per
    column, the rows gathered by a shuffle)."""
    i8, i32, i64, f32 = ir.IntType(8), ir.IntType(32), ir.IntType(64), ir.FloatType()
    lanes = 8
    accumulator, floats = ir.VectorType(i32, lanes), ir.VectorType(f32, lanes)
    roundeven = _intrinsic_function(builder, "llvm.roundeven.v8f32", floats, [floats])
    zeros_f, lows, highs = (broadcast(value, floats) for value in (zero, low, high))
    rows = []
    for i in range(TILE_ROWS):
        row_bias = broadcast(builder.load(builder.gep(bias_ptr, [ir.Constant(i64, i)])), accumulator)
        row_scale = broadcast(builder.load(builder.gep(scale_ptr, [ir.Constant(i64, i)])), floats)
        vectors = []
        for v in range(_VECTORS):
            total = builder.add(totals[i * _VECTORS + v], row_bias)
            value = builder.call(roundeven, [builder.fmul(builder.sitofp(total, floats), row_scale)])
            value = builder.fadd(value, zeros_f)
            value = builder.select(builder.fcmp_unordered("<", value, lows), lows, value)
            value = builder.select(builder.fcmp_ordered(">", value, highs), highs, value)
            vectors.append(builder.trunc(builder.fptosi(value, accumulator), ir.VectorType(i8, lanes)))
        rows.append(vectors)
    assert TILE_ROWS == 4  # a column's rows are one 32-bit word
    for v in range(_VECTORS):
        low_pair = builder.shuffle_vector(
            rows[0][v], rows[1][v], ir.Constant(ir.VectorType(i32, 16), list(range(16)))
        )
        high_pair = builder.shuffle_vector(
            rows[2][v], rows[3][v], ir.Constant(ir.VectorType(i32, 16), list(range(16)))
        )
        # element i * 8 + c (row i, column c) -> position c * 4 + i
        order = [i * lanes + c for c in range(lanes) for i in range(TILE_ROWS)]
        gathered = builder.shuffle_vector(low_pair, high_pair, ir.Constant(ir.VectorType(i32, 32), order))
        words = builder.bitcast(gathered, accumulator)
        for c in range(lanes):
            column = builder.gep(out_ptr, [builder.mul(ir.Constant(i64, v * lanes + c), ldo)])
            word = builder.extract_element(words, ir.Constant(i32, c))
            builder.store(word, builder.bitcast(column, i32.as_pointer()), align=1)


def _tile_signature(
    packed, packed_at, w, w_at, steps, bias, scale, row_at, zero, low, high, out, out_at, ldo
):
    return types.void(
        packed, packed_at, w, w_at, steps, bias, scale, row_at, zero, low, high, out, out_at, ldo
    )


@intrinsic
def _maddubs_tile(
    typingctx, packed, packed_at, w, w_at, steps, bias, scale, row_at, zero, low, high, out, out_at, ldo
):
    """A TILE_ROWS x TILE_COLUMNS tile: ``steps`` steps of 4 k of the packed columns
    (``packed`` from ``packed_at``, GROUP_BYTES a step) by a weights' panel (``w`` from
    ``w_at``), stored from ``out[out_at]`` at row stride ``ldo`` (elements): requantized with
    ``bias``, ``scale`` from ``row_at`` and float32 ``zero``, ``low``, ``high`` into uint8
    ``out``, or ``acc + bias`` into int32 ``out``. Weights within [-64, 64] only."""
    sig = _tile_signature(
        packed, packed_at, w, w_at, steps, bias, scale, row_at, zero, low, high, out, out_at, ldo
    )
    return sig, lambda context, builder, signature, args: _emit_tile(context, builder, signature, args, False)


@intrinsic
def _int16_tile(
    typingctx, packed, packed_at, w, w_at, steps, bias, scale, row_at, zero, low, high, out, out_at, ldo
):
    """:func:`_maddubs_tile` by steps of 2 k of int16, exact for any weights."""
    sig = _tile_signature(
        packed, packed_at, w, w_at, steps, bias, scale, row_at, zero, low, high, out, out_at, ldo
    )
    return sig, lambda context, builder, signature, args: _emit_tile(context, builder, signature, args, True)


@intrinsic
def _maddubs_tile_across(
    typingctx, packed, packed_at, w, w_at, steps, bias, scale, row_at, zero, low, high, out, out_at, ldo
):
    """:func:`_maddubs_tile` into uint8 ``out`` the other way round: the tile's column j at
    ``out[out_at + j * ldo]``, its rows the 4 bytes from there."""
    sig = _tile_signature(
        packed, packed_at, w, w_at, steps, bias, scale, row_at, zero, low, high, out, out_at, ldo
    )
    return sig, lambda context, builder, signature, args: _emit_tile(
        context, builder, signature, args, False, True
    )


@intrinsic
def _int16_tile_across(
    typingctx, packed, packed_at, w, w_at, steps, bias, scale, row_at, zero, low, high, out, out_at, ldo
):
    """:func:`_int16_tile` stored as :func:`_maddubs_tile_across` stores."""
    sig = _tile_signature(
        packed, packed_at, w, w_at, steps, bias, scale, row_at, zero, low, high, out, out_at, ldo
    )
    return sig, lambda context, builder, signature, args: _emit_tile(
        context, builder, signature, args, True, True
    )


@njit(inline="always", nogil=True, cache=True)
def _pack_columns(x, q, columns, depth, packed):
    """Columns ``q .. q + columns`` of ``x`` as steps of ``depth`` k (the layout of
    :func:`_interleave_bytes` or :func:`_interleave_words`), zero-padded to the full block and
    to a whole last step."""
    k = x.shape[0]
    steps = -(-k // depth)
    ldx = x.strides[0]
    whole = k // depth if columns == TILE_COLUMNS else 0
    for s in range(whole):
        if depth == 4:
            _interleave_bytes(x, s * 4 * ldx + q, ldx, packed, s * GROUP_BYTES)
        else:
            _interleave_words(x, s * 2 * ldx + q, ldx, packed, s * GROUP_BYTES)
    # The last rows (fewer than a step) or a block of fewer columns, a byte at a time.
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
    if kernel == MADDUBS:
        _maddubs_tile(packed, x_at, panels, w_at, steps, bias, scale, r, zero, low, high, out, out_at, ldo)
    else:
        _int16_tile(packed, x_at, panels, w_at, steps, bias, scale, r, zero, low, high, out, out_at, ldo)


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
    depth = 4 if kernel == MADDUBS else 2
    steps = -(-(x.shape[1] if transposed else x.shape[0]) // depth)
    rows = -(-m // TILE_ROWS) * TILE_ROWS
    row_bias, row_scale = np.zeros(rows, np.int32), np.zeros(rows, np.float32)  # padded to the panels
    for i in range(m):
        row_bias[i], row_scale[i] = bias[i], scale[i]
    ldo = out.strides[0] // out.itemsize
    block_bytes = steps * GROUP_BYTES
    # Blocks packed at once, then each panel of weights by all of them: the weights stream
    # from memory once per chunk of columns (once for a late layer's few pixels), the
    # packed blocks stay in L2.
    chunk = max(1, min(-(-(n1 - n0) // TILE_COLUMNS), CHUNK_BYTES // max(1, block_bytes)))
    packed = np.empty(chunk * block_bytes, np.uint8)
    edge = np.empty((TILE_ROWS, TILE_COLUMNS), out.dtype)
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
                    if kernel == MADDUBS:
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
