"""The register-tile micro-kernel of CpuAcc's float32 GEMMs (``tiles.py``, ``packed_gemm.py``,
the few-pixel convs), written in LLVM IR through numba's ``intrinsic``: a tile of
``TILE_ROWS`` x ``TILE_COLUMNS`` outputs whose accumulators stay in vector registers, as the
micro-kernels of BLIS and of the Compute Library's GEMM.

:func:`_tile` reads the left operand from a packed panel (k-major, ``TILE_ROWS`` values per
step) and the right one in place, a row of ``TILE_COLUMNS`` values per step at any stride;
:func:`_row_tile` is the same the other way round, for weights that are the right operand,
read from panels of ``TILE_COLUMNS`` columns, with a bias per column; :func:`_column_tile`
reads its left operand down columns. Bias and ReLU or a clip are applied as the
accumulators are stored.

The tile is 8 x 32 on machines with AVX-512 (16 zmm accumulators), 6 x 16 with AVX2 and FMA
(12 ymm); elsewhere :data:`AVAILABLE` is False and callers use BLAS. ``FLOWRT_TILES=off`` in
the environment (read once at import) makes CpuAcc use BLAS everywhere. ``avx512`` and ``avx2``
force a tile shape, for tests only and with a ``NUMBA_CACHE_DIR`` of their own: numba's cache
knows the host's features, not this choice.
"""

from __future__ import annotations

import os

import llvmlite.binding as llvm
from llvmlite import ir
from numba import types
from numba.core.extending import intrinsic

from flowrt.errors import BackendError
from flowrt.workers.cpu.acc.half import half_to_float


def _tile_shape(choice: str | None) -> tuple[int, int, bool]:
    """(lanes per vector, tile rows, available) for ``FLOWRT_TILES``, or by the host's
    features when unset. Unavailable tiles keep a shape that compiles (callers skip them)."""
    features = llvm.get_host_cpu_features()
    host = (
        "avx512"
        if features.get("avx512f")
        else "avx2"
        if features.get("avx2") and features.get("fma")
        else "off"
    )
    shapes = {"avx512": (16, 8, True), "avx2": (8, 6, True), "off": (8, 6, False)}
    if choice == "off" and host != "off":
        return (*shapes[host][:2], False)
    if choice and choice not in shapes:
        raise BackendError(f"FLOWRT_TILES must be one of {sorted(shapes)}, got {choice!r}")
    return shapes[choice or host]


LANES, TILE_ROWS, AVAILABLE = _tile_shape(os.environ.get("FLOWRT_TILES"))
_VECTORS = 2  # vectors of LANES floats per tile row
TILE_COLUMNS = LANES * _VECTORS
# The shape of the weights' panels, which follows the host's features: a part of the name of
# every kept form of the weights laid out in tiles (``engine/memory/weights.py``).
PANEL_LAYOUT = (TILE_ROWS, TILE_COLUMNS)
# What a tile applies as it stores (its ``mode``): nothing, Relu, or a clip to its bounds.
RELU_MODE, CLIP_MODE = 1, 2
# A tile's ``accumulate`` that starts from the bias and adds what ``c`` holds (a residual put
# there before): the first block of k of a conv with a residual Add fused.
ONTO_BIAS = 2
# How far ahead of the row it reads (in floats: two tiles) the micro-kernel asks for ``b``.
# A tile reads one short run of each of K rows; the hardware prefetchers follow few such
# streams, and without this the 1x1 convs of DenseNet-121 ran at 89 GFLOP/s instead of 111.
PREFETCH_AHEAD = 2 * TILE_COLUMNS
# Each step of a tile also asks for the same step of the panel read next (``ahead``): the
# panels of weights too large for the caches come from memory, in runs of a few KB, one per
# panel and block of k, that the hardware prefetchers start on too late. ResNet-50's 3x3
# convs at 14x14 by Winograd (4 MB of transformed weights each), one Zen 5 core: 1.19 ms in
# the model (0.74 with the weights in L3) -> 0.81.

# How far ahead (in floats: 64 steps) a tile that reads its packed operand on the right
# (``_row_tile``, ``_column_tile``) asks for it: each panel is one long run (k x 32 floats),
# which the hardware prefetchers follow too slowly from memory. One Zen 5 core: ResNet-50's
# 7x7 convs 5-10% faster, ViT-S's MatMuls 5.24 -> 4.91 ms a run, ResNet-50 42.6 -> 38.6 ms.
PANEL_AHEAD = 2048


def store_activation(builder, value, mode: int, lows=None, highs=None):
    """``value`` (a float vector) through the activation ``mode`` applied as it is stored:
    ReLU as ``activate()`` (NaN stays NaN: an unordered compare; -0.0 becomes +0.0) when
    RELU_MODE, a clip to [``lows``, ``highs``] (vectors) as ``fastmath.clamp`` (NaN stays NaN:
    ordered compares) when CLIP_MODE, else none."""
    zero = ir.Constant(value.type, [0.0] * value.type.count)
    if mode == RELU_MODE:
        return builder.select(builder.fcmp_unordered(">", value, zero), value, zero)
    if mode == CLIP_MODE:
        value = builder.select(builder.fcmp_ordered("<", value, lows), lows, value)
        return builder.select(builder.fcmp_ordered(">", value, highs), highs, value)
    return value


def _intrinsic_function(builder, name, return_type, argument_types):
    return builder.module.globals.get(name) or ir.Function(
        builder.module, ir.FunctionType(return_type, argument_types), name
    )


def close_loop(builder, entry, step, count, sums, starts, updated, loop, done) -> ir.Block:
    """End a tile's loop body: ``step`` (a phi) goes 0 .. ``count``, each of ``sums`` (phis, by
    row and vector) starts at ``starts`` from ``entry`` and takes ``updated`` from the body;
    branch back to ``loop`` or on to ``done``. Returns the body's last block."""
    following = builder.add(step, ir.Constant(step.type, 1))
    tail = builder.block
    step.add_incoming(ir.Constant(step.type, 0), entry)
    step.add_incoming(following, tail)
    for row, row_starts, row_updated in zip(sums, starts, updated):
        for total, start, new in zip(row, row_starts, row_updated):
            total.add_incoming(start, entry)
            total.add_incoming(new, tail)
    builder.cbranch(builder.icmp_signed("<", following, count), loop, done)
    return tail


def _emit_tile(
    context,
    builder,
    signature,
    args,
    masked: bool,
    rows_in_place: bool = False,
    by_columns: bool = False,
    vectors: int = _VECTORS,
    by_offsets: bool = False,
):
    """The micro-kernel's IR (see :func:`_tile`); ``masked``: only the first ``columns``
    columns are read and written. ``rows_in_place`` (:func:`_row_tile`): ``a`` is read in
    place, row i from ``a_at + i * lda``, ``b`` is a packed panel, and the bias is per column
    (and ``mode`` is Relu or none: no bounds); ``by_columns`` (:func:`_column_tile`): ``a``'s
    row i is read down a column instead, step p from ``a_at + i + p * lda``. ``vectors``:
    vectors of ``LANES`` columns per row (1: a narrow tile, for a last block of few columns).
    ``by_offsets`` (:func:`_offset_tile`): ``b``'s step p is read from ``b_at +
    offsets[off_at + p]``, the two arguments in ``ldb``'s place. ``a`` or ``b`` (the packed
    weights) may be uint16, float16 bits (``half.py``): each value read is widened to float."""
    low = high = ahead = offsets = None
    if by_offsets:  # the offsets' first one read, then the arguments as _tile's (ldb unused)
        offsets = builder.gep(
            context.make_array(signature.args[4])(context, builder, args[4]).data, [args[5]]
        )
        args = (*args[:5], *args[6:])
        signature = signature.replace(args=(*signature.args[:5], *signature.args[6:]))
    if rows_in_place:  # lda and accumulate come out; the rest reads as _tile's arguments
        lda, accumulate = args[2], args[13]
        args = (*args[:2], *args[3:13], *args[14:])
        signature_args = (*signature.args[:2], *signature.args[3:13], *signature.args[14:])
    else:  # the clip bounds, accumulate and ahead come out
        low, high, accumulate, ahead = args[12], args[13], args[14], args[15]
        args = (*args[:12], *args[16:])
        signature_args = (*signature.args[:12], *signature.args[16:])
    a_arr, a_at, b_arr, b_at, ldb, c_arr, c_at, ldc, k, bias_arr, bias_at, mode = args[:12]
    a_ptr, b_ptr, c_ptr, bias_ptr = (
        builder.gep(context.make_array(signature_args[i])(context, builder, args[i]).data, [args[i + 1]])
        for i in (0, 2, 5, 9)
    )
    f32, i1, i32, i64 = ir.FloatType(), ir.IntType(1), ir.IntType(32), ir.IntType(64)
    vec, i8_ptr = ir.VectorType(f32, LANES), ir.IntType(8).as_pointer()
    vec_ptr = vec.as_pointer()
    fmuladd = _intrinsic_function(builder, f"llvm.fmuladd.v{LANES}f32", vec, [vec, vec, vec])
    prefetch = _intrinsic_function(builder, "llvm.prefetch.p0i8", ir.VoidType(), [i8_ptr, i32, i32, i32])
    mask_type = ir.VectorType(i1, LANES)
    load_masked = _intrinsic_function(
        builder, f"llvm.masked.load.v{LANES}f32.p0v{LANES}f32", vec, [vec_ptr, i32, mask_type, vec]
    )
    store_masked = _intrinsic_function(
        builder,
        f"llvm.masked.store.v{LANES}f32.p0v{LANES}f32",
        ir.VoidType(),
        [vec, vec_ptr, i32, mask_type],
    )
    undef = ir.Constant(vec, ir.Undefined)
    zero = ir.Constant(vec, [0.0] * LANES)
    spread = ir.Constant(ir.VectorType(i32, LANES), [0] * LANES)

    def broadcast(value, into=undef):
        one = builder.insert_element(ir.Constant(into.type, ir.Undefined), value, ir.Constant(i32, 0))
        return builder.shuffle_vector(one, ir.Constant(into.type, ir.Undefined), spread)

    def at(ptr, offset):
        return builder.bitcast(builder.gep(ptr, [ir.Constant(i64, offset)]), vec_ptr)

    masks = []
    if masked:
        columns = broadcast(args[12], ir.Constant(ir.VectorType(i64, LANES), ir.Undefined))
        for v in range(vectors):
            lanes = ir.Constant(ir.VectorType(i64, LANES), [v * LANES + j for j in range(LANES)])
            masks.append(builder.icmp_signed("<", lanes, columns))

    def load(ptr, v):
        if masked:
            return builder.call(load_masked, [at(ptr, v * LANES), ir.Constant(i32, 4), masks[v], zero])
        return builder.load(at(ptr, v * LANES), align=4)

    # b may hold float16 bits (``half.py``): read as vectors of i16 and widened to float.
    half_b = signature_args[2].dtype == types.uint16
    b_size = 2 if half_b else 4  # bytes per element of b
    if half_b:
        bits = ir.VectorType(ir.IntType(16), LANES)
        load_bits_masked = _intrinsic_function(
            builder,
            f"llvm.masked.load.v{LANES}i16.p0v{LANES}i16",
            bits,
            [bits.as_pointer(), i32, mask_type, bits],
        )

    def load_b(ptr, v):
        if not half_b:
            return load(ptr, v)
        where = builder.bitcast(builder.gep(ptr, [ir.Constant(i64, v * LANES)]), bits.as_pointer())
        if masked:
            no_bits = ir.Constant(bits, [0] * LANES)
            return half_to_float(
                builder, builder.call(load_bits_masked, [where, ir.Constant(i32, 2), masks[v], no_bits])
            )
        return half_to_float(builder, builder.load(where, align=2))

    def store(value, ptr, v):
        if masked:
            builder.call(store_masked, [value, at(ptr, v * LANES), ir.Constant(i32, 4), masks[v]])
        else:
            builder.store(value, at(ptr, v * LANES), align=4)

    # The products summed from zero, then the bias added (accumulate 0), or what c holds (1: a
    # product summed in blocks of k, each block's sum rounded on its own), or both (2:
    # ONTO_BIAS, c filled with a residual), as BLAS and a separate Add would: a sum started
    # from the bias carries it through every rounding (the largest error of a 256-long
    # MatMul and bias doubled, 3.9e-7 -> 7.7e-7 of the output).
    onto_c = builder.icmp_signed("!=", accumulate, ir.Constant(i64, 0))
    from_zero = builder.icmp_signed("==", accumulate, ir.Constant(i64, 1))
    starts = [[zero] * vectors for _ in range(TILE_ROWS)]
    entry = builder.block
    loop = builder.append_basic_block("tile.loop")
    done = builder.append_basic_block("tile.done")
    builder.cbranch(builder.icmp_signed(">", k, ir.Constant(i64, 0)), loop, done)

    builder.position_at_end(loop)
    step = builder.phi(i64)
    sums = [[builder.phi(vec) for _ in range(vectors)] for _ in range(TILE_ROWS)]
    if by_columns:
        a_column = builder.gep(a_ptr, [builder.mul(step, lda)])
        a_values = [builder.gep(a_column, [ir.Constant(i64, i)]) for i in range(TILE_ROWS)]
    elif rows_in_place:
        a_values = [
            builder.gep(a_ptr, [builder.add(builder.mul(ir.Constant(i64, i), lda), step)])
            for i in range(TILE_ROWS)
        ]
    else:
        a_row = builder.gep(a_ptr, [builder.mul(step, ir.Constant(i64, TILE_ROWS))])
        a_values = [builder.gep(a_row, [ir.Constant(i64, i)]) for i in range(TILE_ROWS)]
    if offsets is not None:
        b_row = builder.gep(b_ptr, [builder.load(builder.gep(offsets, [step]))])
    else:
        b_row = builder.gep(b_ptr, [builder.mul(step, ldb)])
    b_vecs = [load_b(b_row, v) for v in range(vectors)]
    if ahead is not None:  # the same step of the panel read next, into L2
        the_next = builder.bitcast(builder.gep(a_values[0], [ahead]), i8_ptr)
        builder.call(prefetch, [the_next, ir.Constant(i32, 0), ir.Constant(i32, 2), ir.Constant(i32, 1)])
    if rows_in_place:  # the packed panel further on, into L2
        for line in range(0, TILE_COLUMNS * b_size, 64):
            further = builder.gep(b_row, [ir.Constant(i64, PANEL_AHEAD + line // b_size)])
            further = builder.bitcast(further, i8_ptr)
            builder.call(prefetch, [further, ir.Constant(i32, 0), ir.Constant(i32, 2), ir.Constant(i32, 1)])
    if not masked and not rows_in_place:  # a packed panel is read in order: no need
        for line in range(0, TILE_COLUMNS * b_size, 64):
            soon = builder.gep(b_row, [ir.Constant(i64, PREFETCH_AHEAD + line // b_size)])
            soon = builder.bitcast(soon, i8_ptr)
            builder.call(prefetch, [soon, ir.Constant(i32, 0), ir.Constant(i32, 3), ir.Constant(i32, 1)])
    updated = []
    half_a = signature_args[0].dtype == types.uint16  # float16 bits (``half.py``)
    a_floats = None
    if half_a and not by_columns and not rows_in_place:  # a packed panel's step: one vector
        a_bits = ir.VectorType(ir.IntType(16), TILE_ROWS)
        a_floats = half_to_float(builder, builder.load(builder.bitcast(a_row, a_bits.as_pointer()), align=2))
    for i in range(TILE_ROWS):
        if a_floats is not None:  # its lane i spread, not eight conversions a step
            lane = ir.Constant(ir.VectorType(i32, LANES), [i] * LANES)
            a_vec = builder.shuffle_vector(a_floats, ir.Constant(a_floats.type, ir.Undefined), lane)
        else:
            a_value = builder.load(a_values[i])
            a_vec = broadcast(half_to_float(builder, a_value) if half_a else a_value)
        updated.append([builder.call(fmuladd, [a_vec, b_vecs[v], sums[i][v]]) for v in range(vectors)])
    tail = close_loop(builder, entry, step, k, sums, starts, updated, loop, done)

    builder.position_at_end(done)
    totals = [[builder.phi(vec) for _ in range(vectors)] for _ in range(TILE_ROWS)]
    if rows_in_place:  # a bias per column
        column_bias = [builder.load(at(bias_ptr, v * LANES), align=4) for v in range(vectors)]  # padded
        biases = [column_bias] * TILE_ROWS
    else:  # a bias per row
        biases = [
            [broadcast(builder.load(builder.gep(bias_ptr, [ir.Constant(i64, i)])))] * vectors
            for i in range(TILE_ROWS)
        ]
    rows = []
    for i in range(TILE_ROWS):
        c_row = builder.gep(c_ptr, [builder.mul(ir.Constant(i64, i), ldc)])
        for v in range(vectors):
            total = totals[i][v]
            total.add_incoming(starts[i][v], entry)
            total.add_incoming(updated[i][v], tail)
            total = builder.select(from_zero, total, builder.fadd(total, biases[i][v]))
            total = builder.select(onto_c, builder.fadd(total, load(c_row, v)), total)
            rows.append((c_row, v, total))

    if low is None:
        with_relu = builder.icmp_signed("==", mode, ir.Constant(i64, RELU_MODE))
        for c_row, v, total in rows:
            store(builder.select(with_relu, store_activation(builder, total, RELU_MODE), total), c_row, v)
        return context.get_dummy_value()
    # One store path per mode, so that a tile pays only for its own activation: selects on the
    # mode cost a small-K tile (a 1x1 conv of 16 channels) about a fifth of its time.
    lows, highs = broadcast(low), broadcast(high)
    end = builder.append_basic_block("tile.stored")
    paths = {mode_: builder.append_basic_block(f"tile.store{mode_}") for mode_ in (0, RELU_MODE, CLIP_MODE)}
    switch = builder.switch(mode, paths[0])
    for mode_ in (RELU_MODE, CLIP_MODE):
        switch.add_case(ir.Constant(i64, mode_), paths[mode_])
    for mode_, block in paths.items():
        builder.position_at_end(block)
        for c_row, v, total in rows:
            store(store_activation(builder, total, mode_, lows, highs), c_row, v)
        builder.branch(end)
    builder.position_at_end(end)
    return context.get_dummy_value()


@intrinsic
def _tile(
    typingctx, a, a_at, b, b_at, ldb, c, c_at, ldc, k, bias, bias_at, mode, low, high, accumulate, ahead
):
    """``c[c_at + i*ldc + j] = act(start + sum_p a[a_at + p*TILE_ROWS + i] * b[b_at + p*ldb +
    j])`` for ``i < TILE_ROWS``, ``j < TILE_COLUMNS``, ``start`` being ``bias[bias_at + i]``,
    or what ``c`` holds there when ``accumulate`` is 1, or both when it is ``ONTO_BIAS``
    (the sum added to the bias first); ``act`` is ReLU when ``mode``
    is RELU_MODE, a clip to [``low``, ``high``] when CLIP_MODE, else none; each step asks for
    ``a[a_at + p*TILE_ROWS + ahead]`` too (the panel read next). Offsets and strides count
    float32 elements."""
    sig = types.void(
        a, a_at, b, b_at, ldb, c, c_at, ldc, k, bias, bias_at, mode, low, high, accumulate, ahead
    )
    return sig, lambda context, builder, signature, args: _emit_tile(context, builder, signature, args, False)


def _masked_tile(vectors: int, name: str, doc: str):
    """A tile intrinsic (:func:`_tile`'s arguments, then ``columns``) storing only its first
    ``columns`` columns, ``vectors`` vectors wide."""

    def typer(typingctx, a, a_at, b, b_at, ldb, c, c_at, ldc, k, bias, bias_at, mode, low, high, accumulate, ahead, columns):  # fmt: skip
        sig = types.void(
            a, a_at, b, b_at, ldb, c, c_at, ldc, k, bias, bias_at, mode, low, high, accumulate, ahead, columns
        )
        return sig, lambda context, builder, signature, args: _emit_tile(
            context, builder, signature, args, True, vectors=vectors
        )

    typer.__name__ = typer.__qualname__ = name
    typer.__doc__ = doc
    return intrinsic(typer)


_tile_part = _masked_tile(
    _VECTORS, "_tile_part", ":func:`_tile` on the first ``columns`` (< TILE_COLUMNS) columns only."
)
_narrow_tile_part = _masked_tile(
    1,
    "_narrow_tile_part",
    ":func:`_tile` on the first ``columns`` (at most ``LANES``) columns only, one vector per row: half "
    "the steps of a masked :func:`_tile_part`.",
)


@intrinsic
def _row_tile(typingctx, a, a_at, lda, b, b_at, ldb, c, c_at, ldc, k, bias, bias_at, relu, accumulate):
    """``c[c_at + i*ldc + j] = act(start + sum_p a[a_at + i*lda + p] * b[b_at + p*ldb + j])``
    for ``i < TILE_ROWS``, ``j < TILE_COLUMNS``, ``start`` being ``bias[bias_at + j]``, or
    what ``c`` holds there when ``accumulate`` is non-zero: :func:`_tile` with the rows of
    ``a`` read in place and the packed operand on the right."""
    sig = types.void(a, a_at, lda, b, b_at, ldb, c, c_at, ldc, k, bias, bias_at, relu, accumulate)
    return sig, lambda context, builder, signature, args: _emit_tile(
        context, builder, signature, args, False, True
    )


@intrinsic
def _row_tile_part(
    typingctx, a, a_at, lda, b, b_at, ldb, c, c_at, ldc, k, bias, bias_at, relu, accumulate, columns
):
    """:func:`_row_tile` on the first ``columns`` (< TILE_COLUMNS) columns only."""
    sig = types.void(a, a_at, lda, b, b_at, ldb, c, c_at, ldc, k, bias, bias_at, relu, accumulate, columns)
    return sig, lambda context, builder, signature, args: _emit_tile(
        context, builder, signature, args, True, True
    )


@intrinsic
def _column_tile(typingctx, a, a_at, lda, b, b_at, ldb, c, c_at, ldc, k, bias, bias_at, relu, accumulate):
    """:func:`_row_tile` with ``a`` read by columns: ``a[a_at + i + p*lda]`` is row i's step
    p (``a`` is the transpose of the rows multiplied: a conv's input, channels by pixels)."""
    sig = types.void(a, a_at, lda, b, b_at, ldb, c, c_at, ldc, k, bias, bias_at, relu, accumulate)
    return sig, lambda context, builder, signature, args: _emit_tile(
        context, builder, signature, args, False, True, True
    )


def _offsets_tile(vectors: int, masked: bool, name: str, doc: str):
    """A tile intrinsic reading ``b``'s rows at offsets: :func:`_tile`'s arguments with
    ``offsets, off_at`` (an int64 array and the index of its first one) in ``ldb``'s place,
    then ``columns`` where ``masked``."""

    def codegen(context, builder, signature, args):
        return _emit_tile(context, builder, signature, args, masked, vectors=vectors, by_offsets=True)

    if masked:

        def typer(typingctx, a, a_at, b, b_at, offsets, off_at, c, c_at, ldc, k, bias, bias_at, mode, low, high, accumulate, ahead, columns):  # fmt: skip
            sig = types.void(
                a, a_at, b, b_at, offsets, off_at, c, c_at, ldc, k, bias, bias_at, mode, low, high, accumulate,
                ahead, columns,
            )  # fmt: skip
            return sig, codegen

    else:

        def typer(typingctx, a, a_at, b, b_at, offsets, off_at, c, c_at, ldc, k, bias, bias_at, mode, low, high, accumulate, ahead):  # type: ignore[misc]  # fmt: skip
            sig = types.void(
                a, a_at, b, b_at, offsets, off_at, c, c_at, ldc, k, bias, bias_at, mode, low, high, accumulate,
                ahead,
            )  # fmt: skip
            return sig, codegen

    typer.__name__ = typer.__qualname__ = name
    typer.__doc__ = doc
    return intrinsic(typer)


_offset_tile = _offsets_tile(
    _VECTORS,
    False,
    "_offset_tile",
    ":func:`_tile` reading step p of ``b`` at ``b_at + offsets[off_at + p]``: a conv's input "
    "windows read where they lie (rows of phase planes), with no column matrix.",
)
_offset_tile_part = _offsets_tile(
    _VECTORS,
    True,
    "_offset_tile_part",
    ":func:`_offset_tile` on the first ``columns`` (< TILE_COLUMNS) only.",
)
_offset_narrow_tile_part = _offsets_tile(
    1,
    True,
    "_offset_narrow_tile_part",
    ":func:`_offset_tile` on the first ``columns`` (at most ``LANES``) only.",
)
