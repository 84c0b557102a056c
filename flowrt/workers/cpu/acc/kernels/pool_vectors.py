"""MaxPool's inner steps as explicit vectors (LLVM IR through numba's ``intrinsic``), one
vector of ``LANES`` outputs a call, a last part of a row masked; and a short row of bytes
copied as masked vectors (:func:`copy_bytes`, :func:`copy_row`: a QLinearConv's padded
input, its GEMM's last blocks), and floats (:func:`copy_floats`: a FusedConv's residual).

Left to LLVM's loop vectorizer, a row's loop runs ``LANES`` x 4 values an iteration and the
rest one at a time: the rows of a pool are short (13 to 111 values in the light models), so
most of a row ran one value at a time. Called once per vector here, every value is in a
vector. :func:`max3_rows` is the max over three kernel rows (any row step),
:func:`max3_pairs` the max along a row of the classic 3-wide stride-2 window. The maxima are
:func:`stacked_pooling.larger`'s, a compare and select (NaN loses when it comes first), so
the results are the same bit for bit; callers look for NaN apart, as before.
"""

from __future__ import annotations

from llvmlite import binding as llvm
from llvmlite import ir
from numba import njit, types
from numba.core.extending import intrinsic

from flowrt.workers.cpu.acc.tile_ir import LANES, _intrinsic_function

_f32, _i1, _i32, _i64 = ir.FloatType(), ir.IntType(1), ir.IntType(32), ir.IntType(64)
_VEC = ir.VectorType(_f32, LANES)
_MASK = ir.VectorType(_i1, LANES)


def _mask(builder, count, lanes=LANES):
    """Lanes ``0 .. count`` of ``lanes`` on (``count`` an i64)."""
    wide = ir.VectorType(_i64, lanes)
    spread = builder.insert_element(ir.Constant(wide, ir.Undefined), count, ir.Constant(_i32, 0))
    spread = builder.shuffle_vector(
        spread, ir.Constant(wide, ir.Undefined), ir.Constant(ir.VectorType(_i32, lanes), [0] * lanes)
    )
    return builder.icmp_signed("<", ir.Constant(wide, list(range(lanes))), spread)


def _pointer(context, builder, array_type, array, offset, vector=_VEC):
    """A pointer to ``array[offset]`` as a ``vector``."""
    data = context.make_array(array_type)(context, builder, array).data
    return builder.bitcast(builder.gep(data, [offset]), vector.as_pointer())


def _masked(vector):
    """(the LLVM name suffix of a masked load or store of ``vector``, its mask's type, the
    alignment of its element)."""
    element = vector.element
    kind, size = (
        ("f32", 4) if isinstance(element, ir.FloatType) else (f"i{element.width}", element.width // 8)
    )
    name = f"v{vector.count}{kind}"
    return f"{name}.p0{name}", ir.VectorType(_i1, vector.count), size


def _load(builder, pointer, mask, vector=_VEC):
    suffix, mask_type, align = _masked(vector)
    load = _intrinsic_function(
        builder, f"llvm.masked.load.{suffix}", vector, [vector.as_pointer(), _i32, mask_type, vector]
    )
    zero = ir.Constant(vector, [0.0 if isinstance(vector.element, ir.FloatType) else 0] * vector.count)
    return builder.call(load, [pointer, ir.Constant(_i32, align), mask, zero])


def _store(builder, value, pointer, mask, vector=_VEC):
    suffix, mask_type, align = _masked(vector)
    store = _intrinsic_function(
        builder, f"llvm.masked.store.{suffix}", ir.VoidType(), [vector, vector.as_pointer(), _i32, mask_type]
    )
    builder.call(store, [value, pointer, ir.Constant(_i32, align), mask])


def _larger(builder, a, b):
    """``a`` where it is larger than ``b``, else ``b`` (``stacked_pooling.larger``)."""
    return builder.select(builder.fcmp_ordered(">", a, b), a, b)


def _any_nan(builder, values):
    """Whether a lane of any of ``values`` is NaN (an i1)."""
    unordered = builder.fcmp_unordered("uno", values[0], values[0])
    for value in values[1:]:
        unordered = builder.or_(unordered, builder.fcmp_unordered("uno", value, value))
    reduce = _intrinsic_function(builder, f"llvm.vector.reduce.or.v{LANES}i1", _i1, [_MASK])
    return builder.call(reduce, [unordered])


@intrinsic
def max3_rows(typingctx, dst, dst_at, src, a_at, b_at, c_at, count):
    """``dst[dst_at + i] = larger(larger(a[i], b[i]), c[i])`` for ``i < count`` (at most
    LANES), ``a``, ``b``, ``c`` being ``src`` from ``a_at``, ``b_at`` and ``c_at`` (the same
    row twice for a max over fewer rows); whether any value read is NaN. Reads and writes
    nothing past ``count``."""
    sig = types.boolean(dst, dst_at, src, a_at, b_at, c_at, count)

    def codegen(context, builder, signature, args):
        mask = _mask(builder, args[6])
        a, b, c = (
            _load(builder, _pointer(context, builder, signature.args[2], args[2], at), mask)
            for at in args[3:6]
        )
        _store(
            builder,
            _larger(builder, _larger(builder, a, b), c),
            _pointer(context, builder, signature.args[0], args[0], args[1]),
            mask,
        )
        return _any_nan(builder, [a, b, c])

    return sig, codegen


@intrinsic
def max3_pairs(typingctx, dst, dst_at, src, src_at, count):
    """``dst[dst_at + o] = larger(larger(s[2o], s[2o + 1]), s[2o + 2])`` for ``o < count`` (at
    most LANES), ``s`` being ``src`` from ``src_at``: the max along a row of the 3-wide window
    at stride 2. Reads ``2 * LANES + 2`` values from ``src_at`` whatever ``count`` (the caller's
    row buffer has them); writes only ``count``."""
    sig = types.void(dst, dst_at, src, src_at, count)

    def codegen(context, builder, signature, args):
        everything = _mask(builder, ir.Constant(_i64, LANES))
        src_type, src_array = signature.args[2], args[2]

        def vector(offset):
            at = builder.add(args[3], ir.Constant(_i64, offset))
            return _load(builder, _pointer(context, builder, src_type, src_array, at), everything)

        low, high, low2, high2 = vector(0), vector(LANES), vector(2), vector(LANES + 2)
        index = ir.VectorType(_i32, LANES)
        even = builder.shuffle_vector(low, high, ir.Constant(index, [2 * o for o in range(LANES)]))
        odd = builder.shuffle_vector(low, high, ir.Constant(index, [2 * o + 1 for o in range(LANES)]))
        third = builder.shuffle_vector(low2, high2, ir.Constant(index, [2 * o for o in range(LANES)]))
        result = _larger(builder, _larger(builder, even, odd), third)
        _store(
            builder,
            result,
            _pointer(context, builder, signature.args[0], args[0], args[1]),
            _mask(builder, args[4]),
        )
        return context.get_dummy_value()

    return sig, codegen


@intrinsic
def copy_floats(typingctx, dst, dst_at, src, src_at, count):
    """``dst[dst_at : dst_at + count] = src[src_at : src_at + count]`` for ``count`` of at most
    ``LANES`` float32 values, one masked load and store; the offsets count elements from the
    arrays' first ones, so that strided views of rows copy by their leading dimension."""
    sig = types.void(dst, dst_at, src, src_at, count)

    def codegen(context, builder, signature, args):
        mask = _mask(builder, args[4])
        value = _load(builder, _pointer(context, builder, signature.args[2], args[2], args[3]), mask)
        _store(builder, value, _pointer(context, builder, signature.args[0], args[0], args[1]), mask)
        return context.get_dummy_value()

    return sig, codegen


def _interleaving(parts: int):
    """An intrinsic ``(dst, dst_at, src, src_at, stride, count)``: ``dst[dst_at + parts * t +
    b] = src[src_at + b * stride + t]`` for the first ``count`` (at most ``parts * LANES``)
    outputs ``parts * t + b``: ``parts`` rows of ``src`` read as masked vectors, shuffled
    together and stored as one masked vector of ``parts * LANES``. Reads and writes nothing
    past what those outputs need."""
    index = ir.VectorType(_i32, 2 * LANES)
    pairs = ir.Constant(index, [j // 2 + (j % 2) * LANES for j in range(2 * LANES)])
    quads = ir.Constant(
        ir.VectorType(_i32, 4 * LANES),
        [2 * (j // 4) + (j % 2) + (j // 2 % 2) * 2 * LANES for j in range(4 * LANES)],
    )
    wide = ir.VectorType(_f32, parts * LANES)

    def typer(typingctx, dst, dst_at, src, src_at, stride, count):
        sig = types.void(dst, dst_at, src, src_at, stride, count)

        def codegen(context, builder, signature, args):
            # each row's values: ceil(count / parts) of them
            per_row = builder.udiv(
                builder.add(args[5], ir.Constant(_i64, parts - 1)), ir.Constant(_i64, parts)
            )
            mask = _mask(builder, per_row)
            rows = [
                _load(
                    builder,
                    _pointer(
                        context,
                        builder,
                        signature.args[2],
                        args[2],
                        builder.add(args[3], builder.mul(args[4], ir.Constant(_i64, b))),
                    ),
                    mask,
                )
                for b in range(parts)
            ]
            value = builder.shuffle_vector(rows[0], rows[1], pairs)
            if parts == 4:
                value = builder.shuffle_vector(value, builder.shuffle_vector(rows[2], rows[3], pairs), quads)
            pointer = _pointer(context, builder, signature.args[0], args[0], args[1], wide)
            _store(builder, value, pointer, _mask(builder, args[5], parts * LANES), wide)
            return context.get_dummy_value()

        return sig, codegen

    typer.__name__ = typer.__qualname__ = f"interleave{parts}_vector"
    return intrinsic(typer)


# interleave2_vector and interleave4_vector: a row of outputs from 2 or 4 rows of values that
# alternate in it (Winograd's output tiles, 2 or 4 columns wide).
interleave2_vector, interleave4_vector = _interleaving(2), _interleaving(4)


# Bytes :func:`copy_bytes` moves a call: a zmm where the host has AVX-512BW (masked byte loads
# and stores); 0 elsewhere, where LLVM would split a masked byte vector into one branch per
# byte, and callers copy in a loop instead.
BYTE_LANES = 64 if llvm.get_host_cpu_features().get("avx512bw") else 0
_BYTES = ir.VectorType(ir.IntType(8), 64)


@intrinsic
def copy_bytes(typingctx, dst, dst_at, src, src_at, count):
    """``dst[dst_at : dst_at + count] = src[src_at : src_at + count]`` for ``count`` of at
    most 64 bytes, one masked load and store (only where :data:`BYTE_LANES` is 64). Reads and
    writes nothing past ``count``."""
    sig = types.void(dst, dst_at, src, src_at, count)

    def codegen(context, builder, signature, args):
        mask = _mask(builder, args[4], _BYTES.count)
        source = _pointer(context, builder, signature.args[2], args[2], args[3], _BYTES)
        value = _load(builder, source, mask, _BYTES)
        _store(
            builder,
            value,
            _pointer(context, builder, signature.args[0], args[0], args[1], _BYTES),
            mask,
            _BYTES,
        )
        return context.get_dummy_value()

    return sig, codegen


@njit(inline="always", nogil=True, cache=True)
def copy_row(dst, dst_at, src, src_at, count):
    """``dst[dst_at : dst_at + count] = src[src_at : src_at + count]``, bytes, any ``count``: as
    masked vectors (:func:`copy_bytes`) where the host has them, else one byte at a time."""
    if BYTE_LANES:
        for i in range(0, count, BYTE_LANES):
            copy_bytes(dst, dst_at + i, src, src_at + i, min(BYTE_LANES, count - i))
    else:
        for i in range(count):
            dst[dst_at + i] = src[src_at + i]
