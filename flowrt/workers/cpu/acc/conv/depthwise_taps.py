"""Depthwise convs of 3x3 and 5x5 kernels with "same" pads, at stride 1 or 2 (every
depthwise conv of MobileNet, ShuffleNet, MNASNet, EfficientNet), on small planes: explicit
vector code (LLVM IR through numba's ``intrinsic``), ``LANES`` outputs an iteration. Its
algorithm is :class:`DepthwiseVector`, for output planes of at most
``tuning.depthwise_vector_max`` pixels; larger ones keep the loops of ``depthwise.py`` and
``depthwise_strided.py``.

Each input plane is first laid out in a scratch on the output plane's own pitch: at stride
1 the plane itself, at stride 2 its four phase planes (input cell (2R + a, 2C + b) at row R,
column C of phase plane 2a + b), with zero rows above and below that stand for the pad rows.
Then every tap of an output at flat index p is a read at a fixed offset from p: a vector of
consecutive outputs reads each tap as one vector. A tap whose column falls off the plane's
left or right edge reads the far end of the row above or below; the columns' sums are
selected away there, by each output's column (a table of the plane's columns, read as a
vector). ReLU or a clip (ReLU6) is applied as the vector is stored, other curves by the slice
over several planes at once. Two scratches take turns: the next plane is laid out before this
one's taps are read, which would otherwise wait on the stores that just wrote their cells.

Left to LLVM's loop vectorizer, the same loops run ``LANES`` x 4 outputs an iteration and
the rest one at a time: a 7x7 plane (49 outputs) ran all of them one at a time, and the
phase planes of a stride-2 conv were filled one value at a time. Here every output is in a
vector (the last one masked), and the phase planes are filled by splitting each input row
into its even and odd columns with vector shuffles. One Zen 5 core (figures at
``tuning.DEPTHWISE_VECTOR_MAX``): 960 planes 7x7 3x3 29 -> 22 us; 576 planes 14x14 -> 7x7
3x3 67 -> 35 us; whole models 0-5% faster (MNASNet, MobileNetV2 and V3, EfficientNet).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

import attrs
import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.core.extending import intrinsic

from flowrt.workers.cpu.acc.calls import NATIVE, SliceFunction
from flowrt.workers.cpu.acc.conv.depthwise import Depthwise, same_padded
from flowrt.workers.cpu.acc.kernels.epilogue import CLIP, NONE, RELU, activate_planes
from flowrt.workers.cpu.acc.kernels.pool_vectors import _load, _mask, _pointer, _store, copy_floats
from flowrt.workers.cpu.acc.tile_ir import (
    AVAILABLE,
    CLIP_MODE,
    LANES,
    RELU_MODE,
    _intrinsic_function,
    store_activation,
)

if TYPE_CHECKING:
    from flowrt.workers.cpu.acc.conv.algorithms import ActArgs
    from flowrt.workers.cpu.acc.conv.geometry import ConvGeometry
    from flowrt.workers.cpu.acc.conv.tuning import ConvTuning
    from flowrt.workers.cpu.acc.conv.weights import ConvWeights

_f32, _i32, _i64 = ir.FloatType(), ir.IntType(32), ir.IntType(64)
_VEC = ir.VectorType(_f32, LANES)
_COLUMNS = ir.VectorType(_i32, LANES)


def tap_places(size: int, stride: int) -> list[tuple[int, int, int, int]]:
    """(plane, row shift, column shift, tap) of each tap of a ``size`` x ``size`` kernel at
    ``stride`` (1 or 2) with ``size // 2`` pad cells: output (r, c) reads that tap (row-major
    index ``tap`` of the kernel) at row r + row shift, column c + column shift of phase
    plane ``plane`` (the plane itself at stride 1)."""
    radius = size // 2
    places = []
    for di in range(size):
        for dj in range(size):
            row, column = di - radius, dj - radius  # input offsets from (stride*r, stride*c)
            plane = (row % stride) * stride + column % stride
            places.append((plane, row // stride, column // stride, di * size + dj))
    return places


def mode_loops(builder, mode, count, vector) -> None:
    """Loops over ``0 .. count`` (an i64, at least 1) by ``LANES``: ``vector(i, m, full)``
    emits the outputs from ``i`` under store activation ``m`` (``full``: all ``LANES`` of
    them). One loop per mode, as the GEMM tiles store theirs (``tile_ir``), so that each
    pays only for its own; the whole vectors first, then the last part (``full`` False)."""
    whole = builder.mul(builder.sdiv(count, ir.Constant(_i64, LANES)), ir.Constant(_i64, LANES))
    end = builder.append_basic_block("vectors.done")
    starts = {m: builder.append_basic_block(f"vectors.start{m}") for m in (0, RELU_MODE, CLIP_MODE)}
    switch = builder.switch(mode, starts[0])
    for m in (RELU_MODE, CLIP_MODE):
        switch.add_case(ir.Constant(_i64, m), starts[m])
    for m, start in starts.items():
        loop = builder.append_basic_block(f"vectors.loop{m}")
        last = builder.append_basic_block(f"vectors.last{m}")
        builder.position_at_end(start)
        builder.cbranch(builder.icmp_signed(">", whole, ir.Constant(_i64, 0)), loop, last)
        builder.position_at_end(loop)
        i = builder.phi(_i64)
        i.add_incoming(ir.Constant(_i64, 0), start)
        vector(i, m, True)
        following = builder.add(i, ir.Constant(_i64, LANES))
        i.add_incoming(following, builder.block)
        builder.cbranch(builder.icmp_signed("<", following, whole), loop, last)
        builder.position_at_end(last)
        with builder.if_then(builder.icmp_signed("<", whole, count)):
            vector(whole, m, False)
        builder.branch(end)
    builder.position_at_end(end)


def broadcast(builder, value, vector):
    """``value`` in every lane of a ``vector`` type."""
    one = builder.insert_element(ir.Constant(vector, ir.Undefined), value, ir.Constant(_i32, 0))
    spread = ir.Constant(ir.VectorType(_i32, vector.count), [0] * vector.count)
    return builder.shuffle_vector(one, ir.Constant(vector, ir.Undefined), spread)


def _taps_plane(size: int, stride: int):
    """An intrinsic ``(o, oo, src, base, plane_size, pitch, w, wo, b, columns, pixels, mode,
    low, high)``: ``o[oo + p] = act(b + sum of taps)`` for the outputs ``p < pixels`` of one
    plane, each tap ``w[wo + tap] * src[base + p + plane * plane_size + row * pitch +
    column]`` (:func:`tap_places`), the taps whose column falls off the plane
    (``columns[p] + column`` outside ``0 .. pitch``) left out; ``act`` is ReLU when ``mode``
    is RELU_MODE, a clip to [``low``, ``high``] when CLIP_MODE, else none. A loop of
    ``LANES`` outputs an iteration, the last one masked; the weights are read once, before
    it. Reads up to ``LANES`` values from each tap's start (the scratch has room past its
    end); writes only the plane's outputs."""
    places = tap_places(size, stride)
    shifts = sorted({column for _, _, column, _ in places})

    def typer(typingctx, o, oo, src, base, plane_size, pitch, w, wo, b, columns, pixels, mode, low, high):
        sig = types.void(o, oo, src, base, plane_size, pitch, w, wo, b, columns, pixels, mode, low, high)

        def codegen(context, builder, signature, args):
            o_, oo, src, base, plane_size, pitch, w, wo, b, columns, pixels, mode, low, high = args
            kinds = signature.args
            fmuladd = _intrinsic_function(builder, f"llvm.fmuladd.v{LANES}f32", _VEC, [_VEC, _VEC, _VEC])
            spread = ir.Constant(_COLUMNS, [0] * LANES)
            zero = ir.Constant(_VEC, [0.0] * LANES)

            w_at = builder.gep(context.make_array(kinds[6])(context, builder, w).data, [wo])
            weights = {
                tap: broadcast(builder, builder.load(builder.gep(w_at, [ir.Constant(_i64, tap)])), _VEC)
                for _, _, _, tap in places
            }
            offsets = {
                tap: builder.add(
                    builder.mul(plane_size, ir.Constant(_i64, plane)),
                    builder.add(builder.mul(pitch, ir.Constant(_i64, row)), ir.Constant(_i64, shift)),
                )
                for plane, row, shift, tap in places
            }
            width = broadcast(builder, builder.trunc(pitch, _i32), _COLUMNS)
            edges = {
                shift: builder.sub(width, ir.Constant(_COLUMNS, [shift] * LANES))
                for shift in shifts
                if shift > 0
            }
            bias = broadcast(builder, b, _VEC)
            lows, highs = broadcast(builder, low, _VEC), broadcast(builder, high, _VEC)
            load_columns = _intrinsic_function(
                builder,
                f"llvm.masked.load.v{LANES}i32.p0v{LANES}i32",
                _COLUMNS,
                [_COLUMNS.as_pointer(), _i32, ir.VectorType(ir.IntType(1), LANES), _COLUMNS],
            )

            def vector(i, m, full):
                """The outputs from ``i``, through mode ``m``'s activation, stored (``full``:
                all ``LANES`` of them)."""
                outputs = None if full else _mask(builder, builder.sub(pixels, i))
                column_at = _pointer(context, builder, kinds[9], columns, i, _COLUMNS)
                if full:
                    column = builder.load(column_at, align=4)
                else:
                    column = builder.call(load_columns, [column_at, ir.Constant(_i32, 4), outputs, spread])
                start = builder.add(base, i)
                sums = {}
                for _, _, shift, tap in places:
                    at = builder.add(start, offsets[tap])
                    value = builder.load(_pointer(context, builder, kinds[2], src, at), align=4)
                    if shift in sums:
                        sums[shift] = builder.call(fmuladd, [weights[tap], value, sums[shift]])
                    else:
                        sums[shift] = builder.fmul(weights[tap], value)
                result = bias
                for shift in shifts:  # columns left to right, those off the plane selected away
                    total = sums[shift]
                    if shift < 0:
                        on = builder.icmp_signed(">=", column, ir.Constant(_COLUMNS, [-shift] * LANES))
                        total = builder.select(on, total, zero)
                    elif shift > 0:
                        total = builder.select(builder.icmp_signed("<", column, edges[shift]), total, zero)
                    result = builder.fadd(result, total)
                result = store_activation(builder, result, m, lows, highs)
                target = _pointer(context, builder, kinds[0], o_, builder.add(oo, i))
                if full:
                    builder.store(result, target, align=4)
                else:
                    _store(builder, result, target, outputs)

            mode_loops(builder, mode, pixels, vector)
            return context.get_dummy_value()

        return sig, codegen

    typer.__name__ = typer.__qualname__ = f"taps{size}_stride{stride}_plane"
    return intrinsic(typer)


taps3_plane, taps5_plane = _taps_plane(3, 1), _taps_plane(5, 1)
taps3_stride2_plane, taps5_stride2_plane = _taps_plane(3, 2), _taps_plane(5, 2)


@intrinsic
def split_pairs(typingctx, dst, even_at, odd_at, src, src_at, count):
    """``dst[even_at + c] = src[src_at + 2c]`` and ``dst[odd_at + c] = src[src_at + 2c + 1]``
    for the first ``count`` (at most ``2 * LANES``) values of ``src`` from ``src_at``: a row
    split into its even and odd columns, two masked loads, two shuffles and two masked
    stores. Reads and writes nothing past those values."""
    sig = types.void(dst, even_at, odd_at, src, src_at, count)
    index = ir.VectorType(_i32, LANES)

    def codegen(context, builder, signature, args):
        dst, even_at, odd_at, src, src_at, count = args
        low_count = builder.select(
            builder.icmp_signed("<", count, ir.Constant(_i64, LANES)), count, ir.Constant(_i64, LANES)
        )
        low = _load(
            builder, _pointer(context, builder, signature.args[3], src, src_at), _mask(builder, low_count)
        )
        high = _load(
            builder,
            _pointer(context, builder, signature.args[3], src, builder.add(src_at, ir.Constant(_i64, LANES))),
            _mask(builder, builder.sub(count, ir.Constant(_i64, LANES))),
        )
        even = builder.shuffle_vector(low, high, ir.Constant(index, [2 * c for c in range(LANES)]))
        odd = builder.shuffle_vector(low, high, ir.Constant(index, [2 * c + 1 for c in range(LANES)]))
        one = ir.Constant(_i64, 1)
        evens = builder.lshr(builder.add(count, one), one)
        odds = builder.lshr(count, one)
        _store(
            builder, even, _pointer(context, builder, signature.args[0], dst, even_at), _mask(builder, evens)
        )
        _store(builder, odd, _pointer(context, builder, signature.args[0], dst, odd_at), _mask(builder, odds))
        return context.get_dummy_value()

    return sig, codegen


@njit(inline="always", nogil=True, cache=True)
def _store_mode(code):
    """The vector store's activation for ``code`` (0 where the slice applies the curve)."""
    if code == RELU:
        return RELU_MODE
    if code == CLIP:
        return CLIP_MODE
    return 0


@njit(inline="always", nogil=True, cache=True)
def _fill(src, x, xo, height, width, plane_size, pitch, top, before, stride):
    """The input plane at ``x[xo:]`` into the scratch ``src``: at stride 1 the plane itself
    from row ``top`` (the plane's rows are the pitch), at stride 2 each row split into the
    phase planes of its row's parity (even columns to plane 2a, odd ones to 2a + 1). Cells
    not written stay as they are (zero: the pad)."""
    if stride == 1:
        at, pixels = before + top * pitch, height * width
        # whole runs of 4 vectors by the loop LLVM vectorizes (plain loads and stores), the
        # rest as masked vectors
        bulk = pixels - pixels % (4 * LANES)
        to, start = np.uint64(at), np.uint64(xo)
        for c in range(np.uint64(bulk)):
            src[to + c] = x[start + c]
        for c in range(bulk, pixels, LANES):
            copy_floats(src, at + c, x, xo + c, min(LANES, pixels - c))
        return
    for y in range(height):
        a = y % 2
        row = before + (y // 2 + top) * pitch
        even, odd = 2 * a * plane_size + row, (2 * a + 1) * plane_size + row
        for c in range(0, width, 2 * LANES):
            split_pairs(src, even + c // 2, odd + c // 2, x, xo + y * width + c, min(2 * LANES, width - c))


@njit(inline="always", nogil=True, cache=True)
def _slice_planes(s, bounds, x, w, bias, out, code, alpha, beta, stride):
    """Planes ``bounds[s] .. bounds[s + 1]`` of the depthwise conv of C-contiguous ``x`` into
    C-contiguous ``out`` by ``w`` (out channels, k, k), k 3 or 5, at ``stride`` (a constant
    where it is inlined), a vector of outputs at a time, on scratches of the slice."""
    channels, height, width = x.shape[1], x.shape[2], x.shape[3]
    m_count, oh_count, ow_count = out.shape[1], out.shape[2], out.shape[3]
    multiplier = m_count // channels
    pixels = oh_count * ow_count
    size = w.shape[1]
    radius = size // 2
    # rows and cells of zeros around each plane: what the taps' shifts reach past it
    top = radius if stride == 1 else 1
    bottom = radius if stride == 1 else radius // 2
    before = radius if stride == 1 else 1
    plane_size = before + (top + oh_count + bottom) * ow_count + radius
    # two scratches, taking turns (see the module's doc); each tap reads LANES values
    scratch = np.zeros((2, stride * stride * plane_size + LANES), np.float32)
    columns = np.empty(pixels, np.int32)
    for p in range(pixels):
        columns[p] = p % ow_count
    x_flat, out_flat, w_flat = x.reshape(-1), out.reshape(-1), w.reshape(-1)
    mode = _store_mode(code)
    curve = NONE if mode else code  # ReLU or a clip as stored, any other curve after
    base = before + top * ow_count
    first, end = bounds[s], bounds[s + 1]
    pending = first * pixels
    for task in range(first, end + 1):
        if task < end:  # lay out this plane's input, then compute the one before
            n, m = divmod(task, m_count)
            xo = (n * channels + m // multiplier) * height * width
            _fill(
                scratch[(task - first) % 2],
                x_flat,
                xo,
                height,
                width,
                plane_size,
                ow_count,
                top,
                before,
                stride,
            )
        if task == first:
            continue
        src = scratch[(task - 1 - first) % 2]
        m = (task - 1) % m_count
        wo, oo, b = m * size * size, (task - 1) * pixels, bias[m]
        args = (
            out_flat,
            oo,
            src,
            base,
            plane_size,
            ow_count,
            w_flat,
            wo,
            b,
            columns,
            pixels,
            mode,
            alpha,
            beta,
        )
        if stride == 1 and size == 3:
            taps3_plane(*args)
        elif stride == 1:
            taps5_plane(*args)
        elif size == 3:
            taps3_stride2_plane(*args)
        else:
            taps5_stride2_plane(*args)
        pending = activate_planes(out_flat, pending, oo + pixels, task == end, curve, alpha, beta)


@njit(**NATIVE)
def _stride1_slice(s, _step, bounds, x, w, bias, out, code, alpha, beta):
    """Slice ``s`` of :data:`TAPS_STRIDE1`: :func:`_slice_planes` at stride 1."""
    _slice_planes(s, bounds, x, w, bias, out, code, alpha, beta, 1)


@njit(**NATIVE)
def _stride2_slice(s, _step, bounds, x, w, bias, out, code, alpha, beta):
    """Slice ``s`` of :data:`TAPS_STRIDE2`: :func:`_slice_planes` at stride 2."""
    _slice_planes(s, bounds, x, w, bias, out, code, alpha, beta, 2)


# args (bounds, x, w, bias, out, code, alpha, beta), as ``Depthwise.plane_kernel`` takes; ``w``
# C-contiguous (out channels, k, k), k 3 or 5, with k // 2 pad cells on every side.
TAPS_STRIDE1 = SliceFunction(_stride1_slice)
TAPS_STRIDE2 = SliceFunction(_stride2_slice)


@attrs.frozen(eq=False)
class DepthwiseVector(Depthwise):
    """Plan of a 3x3 or 5x5 depthwise conv with unit or 2 strides, no dilation, k // 2 pad
    cells on every side and output planes of at most ``tuning.depthwise_vector_max`` pixels:
    :data:`TAPS_STRIDE1` or :data:`TAPS_STRIDE2` (``depthwise.DEPTHWISE`` where the output
    given is not C-contiguous). Where the host has vectors (the register tiles' hosts)."""

    name: ClassVar[str] = "depthwise_vector"

    @classmethod
    def applies(cls, geometry: ConvGeometry, tuning: ConvTuning) -> bool:
        """A depthwise conv of that shape."""
        return (
            AVAILABLE
            and Depthwise.applies(geometry, tuning)
            and same_padded(geometry, ((1, 1), (2, 2)))
            and geometry.pixels <= tuning.depthwise_vector_max
        )

    def run(
        self, weights: ConvWeights, x, w, w_shape, bias, out, finish: bool, constant: bool, act: ActArgs
    ) -> None:
        """See ``Depthwise.run``; the filters C-contiguous, as the taps read them."""
        super().run(weights, x, np.ascontiguousarray(w), w_shape, bias, out, finish, constant, act)

    def plane_slices(self, filters: np.ndarray) -> SliceFunction:
        """:data:`TAPS_STRIDE1` or :data:`TAPS_STRIDE2`, by the conv's strides."""
        return TAPS_STRIDE1 if self.geo[2] == 1 else TAPS_STRIDE2
