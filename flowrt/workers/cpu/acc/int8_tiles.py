"""The int8 GEMM's micro-kernels (``int8_gemm``), in LLVM IR through numba's ``intrinsic``:
the interleaving of a block of columns of ``x`` into steps of k, and the TILE_ROWS x
TILE_COLUMNS tiles (vpdpbusd with VNNI; else vpmaddubsw pairs, or int16 by vpmaddwd),
stored as rows or across.
"""

from __future__ import annotations

import llvmlite.binding as llvm
from llvmlite import ir
from numba import types
from numba.core.extending import intrinsic

from flowrt.workers.cpu.acc.tile_ir import _intrinsic_function, close_loop

# Without AVX2 the x86 intrinsics would not compile: the tiles then emit nothing, and are never
# called (pack_weights chooses PORTABLE).
_FEATURES = llvm.get_host_cpu_features()
HOST_AVX2 = bool(_FEATURES.get("avx2"))
# vpdpbusd on ymm: AVX512-VNNI with AVX512VL (Ice Lake, Zen 4 and later) or AVX-VNNI (Alder Lake).
HOST_VNNI = HOST_AVX2 and bool(
    (_FEATURES.get("avx512vnni") and _FEATURES.get("avx512vl")) or _FEATURES.get("avxvnni")
)
# With AVX512-VNNI the VNNI tile is 8 rows of 2 zmm (16 int32 columns each): 16 accumulators of
# the 32 registers, each x vector read for 8 rows. Else 4 rows of 2 ymm. The other tiles keep
# ymm (vectors of 8), as many as the tile's columns take (on such a host they only serve tests).
HOST_WIDE = HOST_VNNI and bool(_FEATURES.get("avx512vnni") and _FEATURES.get("avx512bw"))
TILE_ROWS = 8 if HOST_WIDE else 4
TILE_COLUMNS = 32 if HOST_WIDE else 16
# Bytes of packed x per step of k (4 k of a column's bytes, or 2 k of its int16, per column).
GROUP_BYTES = 4 * TILE_COLUMNS


def _array_pointer(context, builder, array_type, array, offset):
    """The address of element ``offset`` of a numba array."""
    return builder.gep(context.make_array(array_type)(context, builder, array).data, [offset])


def _broadcaster(builder, lanes: int):
    """A function of (value, vector type) that puts a scalar in every one of ``lanes`` lanes."""
    i32 = ir.IntType(32)
    mask = ir.Constant(ir.VectorType(i32, lanes), [0] * lanes)

    def broadcast(value, vector_type):
        one = builder.insert_element(ir.Constant(vector_type, ir.Undefined), value, ir.Constant(i32, 0))
        return builder.shuffle_vector(one, ir.Constant(vector_type, ir.Undefined), mask)

    return broadcast


def _open_loop(builder, steps, name: str):
    """(entry, loop, done, step): a loop over ``steps`` steps begun (skipped where there are
    none), the builder at the start of its body, ``step`` the body's first phi; a tile adds
    its sums' phis, then closes the loop with ``tile_ir.close_loop``."""
    i64 = ir.IntType(64)
    entry = builder.block
    loop, done = builder.append_basic_block(f"{name}.loop"), builder.append_basic_block(f"{name}.done")
    builder.cbranch(builder.icmp_signed(">", steps, ir.Constant(i64, 0)), loop, done)
    builder.position_at_end(loop)
    return entry, loop, done, builder.phi(i64)


def _emit_interleave(context, builder, signature, args, depth: int, at: bool = False):
    """The IR of :func:`_interleave_bytes` (``depth`` 4) or :func:`_interleave_words` (2);
    ``at``: of :func:`_interleave_bytes_at` or :func:`_interleave_words_at`, each row at an
    offset of its own."""
    i8, i16, i64 = ir.IntType(8), ir.IntType(16), ir.IntType(64)
    row_type = ir.VectorType(i8, TILE_COLUMNS)
    x = args[0]
    if at:
        offsets, packed, packed_at = args[1 : 1 + depth], args[1 + depth], args[2 + depth]
        packed_type = signature.args[1 + depth]
    else:
        x_at, ldx, packed, packed_at = args[1:]
        offsets = [builder.add(x_at, builder.mul(ir.Constant(i64, r), ldx)) for r in range(depth)]
        packed_type = signature.args[3]
    rows = [
        builder.load(
            builder.bitcast(
                _array_pointer(context, builder, signature.args[0], x, offset), row_type.as_pointer()
            ),
            align=1,
        )
        for offset in offsets
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
    target = _array_pointer(context, builder, packed_type, packed, packed_at)
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


@intrinsic
def _interleave_bytes_at(typingctx, x, a0, a1, a2, a3, packed, packed_at):
    """:func:`_interleave_bytes` with row ``r`` read from ``x[a_r]`` on: the rows of an
    implicit column matrix, windows of a padded input at offsets of their own."""
    sig = types.void(x, a0, a1, a2, a3, packed, packed_at)
    return sig, lambda context, builder, signature, args: _emit_interleave(
        context, builder, signature, args, 4, True
    )


@intrinsic
def _interleave_words_at(typingctx, x, a0, a1, packed, packed_at):
    """:func:`_interleave_words` with row ``r`` read from ``x[a_r]`` on."""
    sig = types.void(x, a0, a1, packed, packed_at)
    return sig, lambda context, builder, signature, args: _emit_interleave(
        context, builder, signature, args, 2, True
    )


def _emit_tile(context, builder, signature, args, kind: str, across: bool = False):
    """The IR of :func:`_maddubs_tile` (``kind`` "maddubs"), :func:`_int16_tile` ("int16") or
    :func:`_vnni_tile` ("vnni"); ``across``: of the ``_across`` tile of the kind."""
    if not HOST_AVX2 or (kind == "vnni" and not HOST_VNNI):  # never called there
        return context.get_dummy_value()
    pairs = kind == "int16"
    lanes = 16 if kind == "vnni" and HOST_WIDE else 8
    vectors = TILE_COLUMNS // lanes
    packed, packed_at, w, w_at, steps, bias, scale, row_at, zero, low, high, out, out_at, ldo = args
    i8, i16, i32, i64 = ir.IntType(8), ir.IntType(16), ir.IntType(32), ir.IntType(64)
    accumulator = ir.VectorType(i32, lanes)
    operand = ir.VectorType(i16, 2 * lanes) if pairs else ir.VectorType(i8, 4 * lanes)
    words = ir.VectorType(i16, 16)
    x_ptr = _array_pointer(context, builder, signature.args[0], packed, packed_at)
    w_ptr = _array_pointer(context, builder, signature.args[2], w, w_at)
    bias_ptr = _array_pointer(context, builder, signature.args[5], bias, row_at)
    scale_ptr = _array_pointer(context, builder, signature.args[6], scale, row_at)
    out_ptr = _array_pointer(context, builder, signature.args[11], out, out_at)
    if kind == "vnni":
        dpbusd = _intrinsic_function(
            builder, f"llvm.x86.avx512.vpdpbusd.{32 * lanes}", accumulator, [accumulator] * 3
        )
    else:
        dpbusd = None
        maddubs = _intrinsic_function(builder, "llvm.x86.avx2.pmadd.ub.sw", words, [operand, operand])
        maddwd = _intrinsic_function(builder, "llvm.x86.avx2.pmadd.wd", accumulator, [words, words])
    ones = ir.Constant(words, [1] * 16)
    broadcast = _broadcaster(builder, lanes)

    def at(ptr, offset, pointee):
        return builder.bitcast(builder.gep(ptr, [offset]), pointee.as_pointer())

    zeros = ir.Constant(accumulator, [0] * lanes)
    entry, loop, done, step = _open_loop(builder, steps, "int8")
    sums = [[builder.phi(accumulator) for _ in range(vectors)] for _ in range(TILE_ROWS)]
    x_step = builder.mul(step, ir.Constant(i64, GROUP_BYTES))
    xs = [
        builder.load(at(x_ptr, builder.add(x_step, ir.Constant(i64, 4 * lanes * v)), operand), align=1)
        for v in range(vectors)
    ]
    w_step = builder.mul(step, ir.Constant(i64, 4 * TILE_ROWS))
    updated = []
    for i in range(TILE_ROWS):
        word = builder.load(at(w_ptr, builder.add(w_step, ir.Constant(i64, 4 * i)), i32), align=1)
        weights = builder.bitcast(broadcast(word, accumulator), operand)
        row = []
        for v in range(vectors):
            if dpbusd is not None:  # the 4 products of each lane summed into it, exact
                x_words = builder.bitcast(xs[v], accumulator)
                row.append(builder.call(dpbusd, [sums[i][v], x_words, builder.bitcast(weights, accumulator)]))
                continue
            if pairs:
                product = builder.call(maddwd, [xs[v], weights])
            else:
                product = builder.call(maddwd, [builder.call(maddubs, [xs[v], weights]), ones])
            row.append(builder.add(sums[i][v], product))
        updated.append(row)
    tail = close_loop(builder, entry, step, steps, sums, [[zeros] * vectors] * TILE_ROWS, updated, loop, done)

    builder.position_at_end(done)
    totals = []
    for i in range(TILE_ROWS):
        for v in range(vectors):
            total = builder.phi(accumulator)
            total.add_incoming(zeros, entry)
            total.add_incoming(updated[i][v], tail)
            totals.append(total)
    requantize = signature.args[11].dtype == types.uint8  # else int32: acc + bias as it is
    # (The tiles across store bytes only: numba also compiles them where they are never called.)
    rows = _finished_rows(
        builder, totals, bias_ptr, scale_ptr, zero, low, high, broadcast, requantize or across, lanes
    )
    if across:
        _store_across(builder, rows, out_ptr, ldo, lanes)
        return context.get_dummy_value()
    for i in range(TILE_ROWS):
        row_ptr = builder.gep(out_ptr, [builder.mul(ir.Constant(i64, i), ldo)])
        for v in range(vectors):
            place = builder.gep(row_ptr, [ir.Constant(i64, lanes * v)])
            builder.store(rows[i][v], builder.bitcast(place, rows[i][v].type.as_pointer()), align=1)
    return context.get_dummy_value()


def _finished_rows(
    builder, totals, bias_ptr, scale_ptr, zero, low, high, broadcast, requantize: bool, lanes: int
):
    """Each row's vectors (of ``lanes`` int32) as they are stored: ``acc + bias`` in int32, or
    (``requantize``) ``clip(roundeven(float(acc + bias) * scale) + zero, low, high)`` as bytes."""
    i8, i32, i64, f32 = ir.IntType(8), ir.IntType(32), ir.IntType(64), ir.FloatType()
    per_row = TILE_COLUMNS // lanes
    accumulator, floats = ir.VectorType(i32, lanes), ir.VectorType(f32, lanes)
    roundeven = _intrinsic_function(builder, f"llvm.roundeven.v{lanes}f32", floats, [floats])
    zeros_f, lows, highs = (broadcast(value, floats) for value in (zero, low, high))
    rows = []
    for i in range(TILE_ROWS):
        row_bias = broadcast(builder.load(builder.gep(bias_ptr, [ir.Constant(i64, i)])), accumulator)
        row_scale = broadcast(builder.load(builder.gep(scale_ptr, [ir.Constant(i64, i)])), floats)
        vectors = []
        for v in range(per_row):
            total = builder.add(totals[i * per_row + v], row_bias)
            if not requantize:
                vectors.append(total)
                continue
            value = builder.call(roundeven, [builder.fmul(builder.sitofp(total, floats), row_scale)])
            value = builder.fadd(value, zeros_f)
            # as np.clip, but NaN (an infinite scale) -> lo rather than a poison value
            value = builder.select(builder.fcmp_unordered("<", value, lows), lows, value)
            value = builder.select(builder.fcmp_ordered(">", value, highs), highs, value)
            vectors.append(builder.trunc(builder.fptosi(value, accumulator), ir.VectorType(i8, lanes)))
        rows.append(vectors)
    return rows


def _store_across(builder, rows, out_ptr, ldo, lanes: int) -> None:
    """A tile's requantized rows stored the other way round: its TILE_ROWS bytes of a column
    are consecutive bytes of the output's row for that column (one store of TILE_ROWS bytes
    per column, the rows gathered by shuffles)."""
    i32, i64 = ir.IntType(32), ir.IntType(64)
    word_type = ir.IntType(8 * TILE_ROWS)
    for v in range(TILE_COLUMNS // lanes):
        # the rows joined end to end: element i * lanes + c is row i, column c
        parts = [rows[i][v] for i in range(TILE_ROWS)]
        while len(parts) > 1:
            width = 2 * parts[0].type.count
            both = ir.Constant(ir.VectorType(i32, width), list(range(width)))
            parts = [builder.shuffle_vector(parts[j], parts[j + 1], both) for j in range(0, len(parts), 2)]
        # -> position c * TILE_ROWS + i
        order = [i * lanes + c for c in range(lanes) for i in range(TILE_ROWS)]
        gathered = builder.shuffle_vector(
            parts[0],
            ir.Constant(parts[0].type, ir.Undefined),
            ir.Constant(ir.VectorType(i32, len(order)), order),
        )
        words = builder.bitcast(gathered, ir.VectorType(word_type, lanes))
        for c in range(lanes):
            column = builder.gep(out_ptr, [builder.mul(ir.Constant(i64, v * lanes + c), ldo)])
            word = builder.extract_element(words, ir.Constant(i32, c))
            builder.store(word, builder.bitcast(column, word_type.as_pointer()), align=1)


def _tile_intrinsic(kind: str, across: bool, doc: str):
    """The ``intrinsic`` of ``kind``'s tile (stored across where ``across``), documented by
    ``doc``: every tile takes the same arguments (see :func:`_maddubs_tile`)."""

    def tile(
        typingctx, packed, packed_at, w, w_at, steps, bias, scale, row_at, zero, low, high, out, out_at, ldo
    ):
        sig = types.void(
            packed, packed_at, w, w_at, steps, bias, scale, row_at, zero, low, high, out, out_at, ldo
        )
        return sig, lambda context, builder, signature, args: _emit_tile(
            context, builder, signature, args, kind, across
        )

    tile.__doc__ = doc
    tile.__name__ = tile.__qualname__ = f"_{kind}_tile{'_across' * across}"
    return intrinsic(tile)


_maddubs_tile = _tile_intrinsic(
    "maddubs",
    False,
    """A TILE_ROWS x TILE_COLUMNS tile: ``steps`` steps of 4 k of the packed columns
    (``packed`` from ``packed_at``, GROUP_BYTES a step) by a weights' panel (``w`` from
    ``w_at``), stored from ``out[out_at]`` at row stride ``ldo`` (elements): requantized with
    ``bias``, ``scale`` from ``row_at`` and float32 ``zero``, ``low``, ``high`` into uint8
    ``out``, or ``acc + bias`` into int32 ``out``. Weights within [-64, 64] only.""",
)
_int16_tile = _tile_intrinsic(
    "int16", False, ":func:`_maddubs_tile` by steps of 2 k of int16, exact for any weights."
)
_vnni_tile = _tile_intrinsic(
    "vnni",
    False,
    """:func:`_maddubs_tile` by ``vpdpbusd`` (a lane's 4 products summed into its int32 at once):
    exact for any weights, on a host with VNNI (:data:`HOST_VNNI`).""",
)
_maddubs_tile_across = _tile_intrinsic(
    "maddubs",
    True,
    """:func:`_maddubs_tile` into uint8 ``out`` the other way round: the tile's column j at
    ``out[out_at + j * ldo]``, its rows the TILE_ROWS bytes from there.""",
)
_int16_tile_across = _tile_intrinsic(
    "int16", True, ":func:`_int16_tile` stored as :func:`_maddubs_tile_across` stores."
)
_vnni_tile_across = _tile_intrinsic(
    "vnni", True, ":func:`_vnni_tile` stored as :func:`_maddubs_tile_across` stores."
)


# Panels a column tile multiplies at once (COLUMN_PANELS * TILE_ROWS rows): each its own
# accumulator, so that consecutive vpdpbusd do not wait for one another.
COLUMN_PANELS = 4


def _emit_column_tile(context, builder, signature, args, panels_at_once: int):
    """The IR of :func:`_vnni_column_tile` (``panels_at_once`` COLUMN_PANELS) or
    :func:`_vnni_column_panel` (1)."""
    if not HOST_VNNI:  # never called there
        return context.get_dummy_value()
    x, x_at, w, w_at, panel_bytes, steps, bias, scale, row_at, zero, low, high, out, out_at = args
    i8, i32, i64, f32 = ir.IntType(8), ir.IntType(32), ir.IntType(64), ir.FloatType()
    lanes = TILE_ROWS  # one lane per row: a step of a panel is TILE_ROWS words of 4 bytes
    accumulator, floats = ir.VectorType(i32, lanes), ir.VectorType(f32, lanes)
    dpbusd = _intrinsic_function(
        builder, f"llvm.x86.avx512.vpdpbusd.{32 * lanes}", accumulator, [accumulator] * 3
    )
    x_ptr = _array_pointer(context, builder, signature.args[0], x, x_at)
    w_ptr = _array_pointer(context, builder, signature.args[2], w, w_at)
    broadcast = _broadcaster(builder, lanes)
    zeros = ir.Constant(accumulator, [0] * lanes)
    entry, loop, done, step = _open_loop(builder, steps, "column")
    sums = [[builder.phi(accumulator)] for _ in range(panels_at_once)]
    word = builder.load(
        builder.bitcast(builder.gep(x_ptr, [builder.mul(step, ir.Constant(i64, 4))]), i32.as_pointer()),
        align=1,
    )
    column = broadcast(word, accumulator)  # the step's 4 bytes of x in every lane
    w_step = builder.mul(step, ir.Constant(i64, 4 * TILE_ROWS))
    updated = []
    for p in range(panels_at_once):
        at = builder.add(w_step, builder.mul(panel_bytes, ir.Constant(i64, p)))
        weights = builder.load(builder.bitcast(builder.gep(w_ptr, [at]), accumulator.as_pointer()), align=1)
        updated.append([builder.call(dpbusd, [sums[p][0], column, weights])])
    tail = close_loop(builder, entry, step, steps, sums, [[zeros]] * panels_at_once, updated, loop, done)
    builder.position_at_end(done)
    totals = []
    for p in range(panels_at_once):
        total = builder.phi(accumulator)
        total.add_incoming(zeros, entry)
        total.add_incoming(updated[p][0], tail)
        totals.append(total)
    out_ptr = _array_pointer(context, builder, signature.args[12], out, out_at)
    bias_ptr = _array_pointer(context, builder, signature.args[6], bias, row_at)
    scale_ptr = _array_pointer(context, builder, signature.args[7], scale, row_at)
    roundeven = _intrinsic_function(builder, f"llvm.roundeven.v{lanes}f32", floats, [floats])
    zeros_f, lows, highs = (broadcast(value, floats) for value in (zero, low, high))
    for p, total in enumerate(totals):
        rows = ir.Constant(i64, p * TILE_ROWS)
        row_bias = builder.load(
            builder.bitcast(builder.gep(bias_ptr, [rows]), accumulator.as_pointer()), align=4
        )
        row_scale = builder.load(
            builder.bitcast(builder.gep(scale_ptr, [rows]), floats.as_pointer()), align=4
        )
        value = builder.sitofp(builder.add(total, row_bias), floats)
        value = builder.fadd(builder.call(roundeven, [builder.fmul(value, row_scale)]), zeros_f)
        value = builder.select(builder.fcmp_unordered("<", value, lows), lows, value)  # as the tiles clip
        value = builder.select(builder.fcmp_ordered(">", value, highs), highs, value)
        stored = builder.trunc(builder.fptosi(value, accumulator), ir.VectorType(i8, lanes))
        place = builder.gep(out_ptr, [rows])
        builder.store(stored, builder.bitcast(place, stored.type.as_pointer()), align=1)
    return context.get_dummy_value()


def _column_tile_intrinsic(panels_at_once: int, doc: str):
    def tile(
        typingctx, x, x_at, w, w_at, panel_bytes, steps, bias, scale, row_at, zero, low, high, out, out_at
    ):
        sig = types.void(
            x, x_at, w, w_at, panel_bytes, steps, bias, scale, row_at, zero, low, high, out, out_at
        )
        return sig, lambda context, builder, signature, args: _emit_column_tile(
            context, builder, signature, args, panels_at_once
        )

    tile.__doc__ = doc
    tile.__name__ = tile.__qualname__ = "_vnni_column_tile" if panels_at_once > 1 else "_vnni_column_panel"
    return intrinsic(tile)


_vnni_column_tile = _column_tile_intrinsic(
    COLUMN_PANELS,
    """COLUMN_PANELS panels of weights (``w`` from ``w_at``, ``panel_bytes`` apart) by one
    column of x (``x`` from ``x_at``: ``steps`` steps of 4 bytes, zero-padded), by
    ``vpdpbusd`` with the column's 4 bytes broadcast: COLUMN_PANELS * TILE_ROWS rows of one
    output column, requantized as the tiles do (``bias`` and ``scale`` from ``row_at``,
    float32 ``zero``, ``low``, ``high``) into the consecutive bytes of uint8 ``out`` from
    ``out_at``. A product of a column or two (a classifier's, batch 1) computes no tile of
    TILE_COLUMNS columns for it. On a host with VNNI only.""",
)
_vnni_column_panel = _column_tile_intrinsic(1, ":func:`_vnni_column_tile` of one panel (TILE_ROWS rows).")
