"""Add, Sub, Mul, Div, Pow and the variadic Sum, Max and Min: numpy broadcasting, float32, a
fused activation.

The output is walked as rows of contiguous runs (``strided.collapse``). Equal shapes make one
flat run, cut into one slice per worker; a per-channel constant (``(C, 1, 1)`` against
``N, C, H, W``) makes one row of ``H*W`` per channel, the constant's value held in a register
along it. Sum, Max and Min fold their inputs pairwise through the output; the activation is
applied on the last fold only. Pow with an exponent repeated along a row (a scalar, most
often a constant 2 or 0.5) takes a loop of its own for 2, 0.5, 1 and 3 (x * x, sqrt, ...), as
numpy's power loop does; any other calls libm's powf per element.
"""

from __future__ import annotations

import math

import numba
import numpy as np
from numba import njit, types
from numba._dispatcher import compute_fingerprint

from flowrt.engine.graph.layers.elementwise import legacy_b_shape
from flowrt.registry import Support, WorkloadInfo
from flowrt.types import DataType
from flowrt.workers.cpu.acc.calls import (
    LateFunction,
    SliceFunction,
    call_late,
    call_native,
    native_address,
    run_tasks,
)
from flowrt.workers.cpu.acc.kernels import acc_kernel
from flowrt.workers.cpu.acc.kernels.epilogue import NONE, RELU, activate_late, activation_args
from flowrt.workers.cpu.acc.kernels.strided import (
    as_index,
    broadcast_strides,
    collapse,
    row_bounds,
    row_offset,
)

ADD, SUB, MUL, DIV, FIRST, POW, MAX, MIN = range(8)
OPS = {"Add": ADD, "Sub": SUB, "Mul": MUL, "Div": DIV, "Sum": ADD, "Pow": POW, "Max": MAX, "Min": MIN}

# Elements per row of a flat walk: small enough that a second (activation) pass over a row
# finds it in cache.
FLAT_ROW = 4096


# error_model="numpy" on every function here: a division by zero gives inf or nan, as in
# numpy, instead of raising.
@njit(nogil=True, cache=True, error_model="numpy")
def _apply(op, x, y):
    """``x op y``; called with ``op`` a constant, so compiled once per op and folded (LLVM
    inlines it into the loops)."""
    if op == ADD:
        return x + y
    if op == SUB:
        return x - y
    if op == MUL:
        return x * y
    if op == DIV:
        return x / y
    if op == POW:
        return x**y
    # as np.maximum and np.minimum: NaN from either side; y when they are equal (-0.0 and 0.0)
    if op == MAX:
        return x if x > y or x != x else y
    if op == MIN:
        return x if x < y or x != x else y
    return x


def _rows_for(op: int):
    """The row walk of one ``op``, compiled for that op alone (``op`` is a constant of the
    closure: numba drops the other ops' branches before typing them, and each loop is
    branch-free, so that it vectorizes; with ``op`` read at run time it is five times slower).

    The function does rows ``first`` to ``last`` (one slice of the window) of
    ``out = activation(a op b)``. Add fuses Relu into its loop (residual Add + Relu); any
    other activation is a second pass over the row, still in cache. Pow with an exponent
    repeated along the row may take :func:`_scalar_power`. When both operands repeat along
    the row (one element each), the one result fills it."""
    commutative = op == ADD or op == MUL

    @njit(nogil=True, cache=True, error_model="numpy")
    def rows(a, a_strides, a_step, b, b_strides, b_step, out, outer, inner, first, last, code, alpha, beta):  # fmt: skip
        size = out.shape[0]
        fused = op == ADD and code == RELU
        # each row's offsets stepped from the last row's along the last outer dimension, and
        # worked out again (a division per dimension) only where it wraps: those divisions
        # cost more than a row of a per-channel multiply (49 elements at 7x7)
        d = outer.shape[0] - 1
        count = outer[d] if d >= 0 else 1
        a_next, b_next = (a_strides[d], b_strides[d]) if d >= 0 else (0, 0)
        k = first % count
        ai = row_offset(first, outer, a_strides)
        bi = row_offset(first, outer, b_strides)
        for r in range(first, last):
            if r > first:
                k += 1
                if k == count:
                    k = 0
                    ai, bi = row_offset(r, outer, a_strides), row_offset(r, outer, b_strides)
                else:
                    ai, bi = ai + a_next, bi + b_next
            lo = r * inner
            n = min(inner, size - lo)
            # whole arrays at unsigned offsets, no slices: a slice costs two reference count
            # updates, as much as a short row's work
            x, xi, xn = a, np.uint64(ai), n if a_step else 1
            y, yi, yn = b, np.uint64(bi), n if b_step else 1
            o, m = np.uint64(lo), np.uint64(n)
            if xn == 1 and yn == 1 and n > 1:
                v = _apply(op, x[xi], y[yi])
                for j in range(m):
                    out[o + j] = v
            elif commutative:
                if xn < yn:
                    x, xi, xn, y, yi, yn = y, yi, yn, x, xi, xn
                if yn < xn:
                    v = y[yi]
                    if fused:
                        for j in range(m):
                            out[o + j] = _relu(_apply(op, x[xi + j], v))
                    else:
                        for j in range(m):
                            out[o + j] = _apply(op, x[xi + j], v)
                elif fused:
                    for j in range(m):
                        out[o + j] = _relu(_apply(op, x[xi + j], y[yi + j]))
                else:
                    for j in range(m):
                        out[o + j] = _apply(op, x[xi + j], y[yi + j])
            elif op == POW and yn < xn and _scalar_power(x[xi : xi + m], y[yi], out[o : o + m]):
                pass
            elif yn < xn:
                v = y[yi]
                for j in range(m):
                    out[o + j] = _apply(op, x[xi + j], v)
            elif xn < yn:
                v = x[xi]
                for j in range(m):
                    out[o + j] = _apply(op, v, y[yi + j])
            else:
                for j in range(m):
                    out[o + j] = _apply(op, x[xi + j], y[yi + j])
            if not fused and code != NONE:
                _activate(out[o : o + m], code, alpha, beta)

    return rows


@njit(nogil=True, cache=True, error_model="numpy")
def _scalar_power(x, e, row):
    """``row = x ** e`` for an exponent ``e`` of 2, 0.5, 1 or 3, without powf, as numpy does
    for a scalar exponent (so 0.5 is sqrt(x) exactly: -0.0 for -0.0, NaN for -inf); False
    for any other ``e``, leaving ``row`` as it was."""
    if e == 2:
        for j in range(row.shape[0]):
            row[j] = x[j] * x[j]
    elif e == 0.5:
        for j in range(row.shape[0]):
            row[j] = math.sqrt(x[j])
    elif e == 1:
        for j in range(row.shape[0]):
            row[j] = x[j]
    elif e == 3:
        for j in range(row.shape[0]):
            row[j] = x[j] * x[j] * x[j]
    else:
        return False
    return True


@njit(inline="always", nogil=True, cache=True)
def _relu(v):
    # np.maximum(v, 0) as CpuRef's Relu: a NaN stays NaN, -inf gives 0. v + 0 is v where it
    # is chosen; in place it keeps the store of an unchanged v from becoming a conditional
    # store, which does not vectorize (epilogue's relu says more).
    return np.float32(0) if v <= 0 else v + np.float32(0)


@njit(nogil=True, cache=True)
def _activate(row, code, alpha, beta):
    """``row = activate(row)``: Relu in a loop of its own, any other activation (rare after
    an elementwise op) through its slot."""
    if code == RELU:
        for j in range(row.shape[0]):
            row[j] = _relu(row[j])
    elif code != NONE:
        activate_late(row, code, alpha, beta)


_ROWS = [_rows_for(op) for op in range(MIN + 1)]
# The row walks as the tape calls them (flat float32 operands, int64 walks, scalars), each
# reached through a slot: a tape compiles none of them, and a model only those of its ops.
_F, _I, _INT, _FLOAT = types.float32[::1], types.int64[::1], types.int64, types.float32
_ROW_TYPES = (_F, _I, _INT, _F, _I, _INT, _F, _I, _INT, _INT, _INT, _INT, _FLOAT, _FLOAT)
_LATE_ROWS = [LateFunction(rows, _ROW_TYPES, f"flowrt_binary_rows_{op}") for op, rows in enumerate(_ROWS)]


@njit(nogil=True, cache=True, error_model="numpy")
def _binary_rows(
    a, a_strides, a_step, b, b_strides, b_step, out, outer, inner, first, last, op, code, alpha, beta
):
    """Rows ``first`` to ``last`` of ``out = activation(a op b)``, ``op`` read at run time (the
    tape's instructions), by the row walk of that op through its slot (``_LATE_ROWS``)."""
    walk = (a, a_strides, a_step, b, b_strides, b_step, out, outer, inner, np.int64(first), np.int64(last))
    args = walk + (np.int64(code), np.float32(alpha), np.float32(beta))
    if op == ADD:
        call_late("flowrt_binary_rows_0", args)
    elif op == SUB:
        call_late("flowrt_binary_rows_1", args)
    elif op == MUL:
        call_late("flowrt_binary_rows_2", args)
    elif op == DIV:
        call_late("flowrt_binary_rows_3", args)
    elif op == FIRST:
        call_late("flowrt_binary_rows_4", args)
    elif op == POW:
        call_late("flowrt_binary_rows_5", args)
    elif op == MAX:
        call_late("flowrt_binary_rows_6", args)
    else:
        call_late("flowrt_binary_rows_7", args)


@njit(nogil=True, cache=True)
def _binary_slice(
    task, step, rows, a, a_strides, a_step, b, b_strides, b_step, out, outer, inner, bounds, code, alpha, beta
):
    """Slice ``task`` of the window, by the row walk of the op at address ``rows``: one
    launcher and one slice function serve every op."""
    args = (a, a_strides, a_step, b, b_strides, b_step, out, outer, inner, bounds[task], bounds[task + 1])
    call_native(rows, args + (code, alpha, beta))


_BINARY_SLICE = SliceFunction(_binary_slice)


class BroadcastWalk:
    """How two operands broadcast to an output shape are walked: rows of ``inner`` elements
    over an ``outer`` grid, each operand stepping 0 (repeated) or 1 along a row.

    Equal shapes (one collapsed dimension) are cut into rows of ``FLAT_ROW``; the last row
    may be shorter."""

    def __init__(self, a_shape, b_shape, out_shape, workers: int) -> None:
        dims, (a_strides, b_strides) = collapse(
            out_shape, broadcast_strides(a_shape, out_shape), broadcast_strides(b_shape, out_shape)
        )
        self.a_step, self.b_step = a_strides[-1], b_strides[-1]
        if len(dims) == 1:
            inner = min(dims[0], FLAT_ROW)
            dims = [-(-dims[0] // inner), inner]
            a_strides = [self.a_step * inner, self.a_step]
            b_strides = [self.b_step * inner, self.b_step]
        self.inner = dims[-1]
        self.outer = as_index(dims[:-1])
        self.a_strides, self.b_strides = as_index(a_strides[:-1]), as_index(b_strides[:-1])
        self.bounds = row_bounds(int(np.prod(dims[:-1])), self.inner, workers)

    def run(self, a, b, out, op, code, alpha, beta) -> None:
        """``out = activation(a op b)``, all arrays flat."""
        if self.bounds.shape[0] == 2:  # one slice: the row walk, called on this thread
            _ROWS[op](
                a, self.a_strides, self.a_step, b, self.b_strides, self.b_step,
                out, self.outer, self.inner, 0, self.bounds[1], code, alpha, beta,
            )  # fmt: skip
            return
        args = (
            a, self.a_strides, self.a_step, b, self.b_strides, self.b_step,
            out, self.outer, self.inner, self.bounds, code, alpha, beta,
        )  # fmt: skip
        key = (op, compute_fingerprint(args))
        found = _ADDRESSES.get(key)
        if found is None:
            found = _ADDRESSES[key] = _addresses(op, args)
        rows, address = found
        run_tasks(address, self.bounds.shape[0] - 1, (rows, *args))


# (row walk, slice function) addresses by op and argument types
_ADDRESSES: dict[tuple[int, bytes], tuple[int, int]] = {}


def _addresses(op: int, args: tuple) -> tuple[int, int]:
    """The addresses of ``op``'s row walk and of the slice function, compiled (or loaded from
    numba's cache) for the arguments ``args`` of :meth:`BroadcastWalk.run`."""
    first_last = (np.int64(0), np.int64(0))
    rows = native_address(_ROWS[op], tuple(map(numba.typeof, args[:9] + first_last + args[10:])))
    return rows, _BINARY_SLICE.address((rows, *args))


@acc_kernel("Add", "Sub", "Mul", "Div", "Pow", "Sum", "Max", "Min")
class ElementwiseKernel:
    """A broadcasting arithmetic op (Sum, Max, Min: over any number of inputs), split across
    workers."""

    @classmethod
    def supports(cls, info: WorkloadInfo) -> Support:
        if not info.inputs or any(x is None or x.dtype is not DataType.FLOAT32 for x in info.inputs):
            return Support.no(f"CpuAcc {info.kind} takes float32 only")
        return Support.yes()

    def __init__(self, info: WorkloadInfo, workers: int) -> None:
        self.info = info
        self.workers = workers
        self.op = OPS[info.kind]
        self.legacy = bool(getattr(info.descriptor, "legacy", False))
        self.activation = activation_args(info.activation)
        # The row walk a tape would call, compiled at load (the kernel's own calls use it too).
        _LATE_ROWS[self.op].address()
        # Constant operands (a Pow's exponent, a bias), copied once into writable arrays:
        # numba types a read-only array apart, and would compile the whole walk for it again.
        self.constants = [None if c is None else np.array(c, np.float32, order="C") for c in info.constants]
        self._walks: dict[tuple, BroadcastWalk] = {}
        self._shapes: dict[tuple, tuple[int, ...]] = {}  # output shape by input shapes

    def walk(self, a_shape, b_shape, out_shape) -> BroadcastWalk:
        """The walk for these shapes (planned once per shape triple)."""
        key = (a_shape, b_shape, out_shape)
        cached = self._walks.get(key)
        if cached is None:
            cached = self._walks[key] = BroadcastWalk(a_shape, b_shape, out_shape, self.workers)
        return cached

    def execute(self, inputs, outputs=None):
        constants = self.constants + [None] * len(inputs)
        arrays = [np.asarray(x, order="C") if c is None else c for x, c in zip(inputs, constants)]
        if self.legacy:
            arrays[1] = arrays[1].reshape(
                legacy_b_shape(arrays[0].shape, arrays[1].shape, self.info.descriptor)
            )
        shapes = tuple(x.shape for x in arrays)
        shape = self._shapes.get(shapes)
        if shape is None:  # np.broadcast_shapes takes microseconds: once per input shapes
            shape = self._shapes[shapes] = np.broadcast_shapes(*shapes)
        out = np.empty(shape, np.float32) if outputs is None else outputs[0]
        if out.size == 0:
            return [out]
        flat = out.reshape(-1)
        if len(arrays) == 1:  # a Sum, Max or Min of one input: a copy
            folds, op = [(arrays[0], arrays[0])], FIRST
        else:  # Sum folds through the output: out = x0 + x1, then out = out + x2, ... (Max, Min alike)
            folds, op = [(arrays[0], arrays[1])] + [(out, x) for x in arrays[2:]], self.op
        no_activation = (NONE, np.float32(0), np.float32(0))
        for i, (a, b) in enumerate(folds):
            code, alpha, beta = self.activation if i == len(folds) - 1 else no_activation
            walk = self.walk(a.shape, b.shape, shape)
            walk.run(a.reshape(-1), b.reshape(-1), flat, op, code, alpha, beta)
        return [out]
