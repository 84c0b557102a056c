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

import numpy as np
from numba import njit, prange

from flowrt.engine.graph.layers.elementwise import legacy_b_shape
from flowrt.registry import Support, WorkloadInfo
from flowrt.types import DataType
from flowrt.workers.cpu.acc.kernels import acc_kernel
from flowrt.workers.cpu.acc.kernels.epilogue import NONE, RELU, activate, activation_args
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
@njit(inline="always", nogil=True, cache=True, error_model="numpy")
def _apply(op, x, y):
    if op == ADD:
        return x + y
    if op == SUB:
        return x - y
    if op == MUL:
        return x * y
    if op == DIV:
        return x / y
    if op >= POW:
        return _pow_max_min_of(op, x, y)
    return x


# Called, not inlined, from _apply: in the loops of the four arithmetic ops its branch is dead,
# and numba's inlining would cost each of them compile time (seconds in all). LLVM inlines it.
@njit(nogil=True, cache=True, error_model="numpy")
def _pow_max_min_of(op, x, y):
    if op == POW:
        return x**y
    # as np.maximum and np.minimum: NaN from either side; y when they are equal (-0.0 and 0.0)
    if op == MAX:
        return x if x > y or x != x else y
    return x if x < y or x != x else y


@njit(inline="always", nogil=True, cache=True)
def _relu(v, relu):
    # np.maximum(v, 0) as CpuRef's Relu: a NaN stays NaN, -inf gives 0
    return (np.float32(0) if v <= 0 else v) if relu else v


@njit(inline="always", nogil=True, cache=True, error_model="numpy")
def _commutative(x, y, out, op, relu):
    """``out = x op y`` (then Relu when ``relu``) for a commutative ``op``; a one-element
    operand repeats."""
    if x.shape[0] < y.shape[0]:
        x, y = y, x
    if y.shape[0] < x.shape[0]:
        v = y[0]
        for j in range(out.shape[0]):
            out[j] = _relu(_apply(op, x[j], v), relu)
    else:
        for j in range(out.shape[0]):
            out[j] = _relu(_apply(op, x[j], y[j]), relu)


@njit(inline="always", nogil=True, cache=True, error_model="numpy")
def _ordered(x, y, out, op):
    """``out = x op y``; a one-element operand repeats."""
    if y.shape[0] < x.shape[0]:
        v = y[0]
        for j in range(out.shape[0]):
            out[j] = _apply(op, x[j], v)
    elif x.shape[0] < y.shape[0]:
        v = x[0]
        for j in range(out.shape[0]):
            out[j] = _apply(op, v, y[j])
    else:
        for j in range(out.shape[0]):
            out[j] = _apply(op, x[j], y[j])


@njit(nogil=True, cache=True, error_model="numpy")
def _pow_max_min_loops(x, y, out, op):
    """``out = x op y``; a one-element operand repeats. Called with ``op`` a constant, numba
    compiles this once per op (a literal argument), each loop with its op folded in."""
    if y.shape[0] < x.shape[0]:
        v = y[0]
        for j in range(out.shape[0]):
            out[j] = _pow_max_min_of(op, x[j], v)
    elif x.shape[0] < y.shape[0]:
        v = x[0]
        for j in range(out.shape[0]):
            out[j] = _pow_max_min_of(op, v, y[j])
    else:
        for j in range(out.shape[0]):
            out[j] = _pow_max_min_of(op, x[j], y[j])


# Called, not inlined, from _segment: numba's inlining costs about a second per loop, paid
# again for each specialization of _binary_rows; called, these loops are compiled once.
@njit(nogil=True, cache=True, error_model="numpy")
def _pow_max_min(x, y, out, op):
    """``out = x op y`` for Pow, Max or Min. An exponent repeated along the row of 2, 0.5, 1
    or 3 is computed without powf, as numpy does for a scalar exponent (so 0.5 is sqrt(x)
    exactly: -0.0 for -0.0, NaN for -inf)."""
    if op == MAX:
        _pow_max_min_loops(x, y, out, MAX)
    elif op == MIN:
        _pow_max_min_loops(x, y, out, MIN)
    elif y.shape[0] < x.shape[0] and y[0] == 2:
        for j in range(out.shape[0]):
            out[j] = x[j] * x[j]
    elif y.shape[0] < x.shape[0] and y[0] == 0.5:
        for j in range(out.shape[0]):
            out[j] = math.sqrt(x[j])
    elif y.shape[0] < x.shape[0] and y[0] == 1:
        for j in range(out.shape[0]):
            out[j] = x[j]
    elif y.shape[0] < x.shape[0] and y[0] == 3:
        for j in range(out.shape[0]):
            out[j] = x[j] * x[j] * x[j]
    else:
        _pow_max_min_loops(x, y, out, POW)


@njit(inline="always", nogil=True, cache=True, error_model="numpy")
def _segment(x, y, out, op, code, alpha, beta):
    """``out = activation(x op y)``.

    Each loop is compiled with its ``op`` constant, so that it is branch-free and vectorizes
    (with ``op`` read at run time it is five times slower). Add fuses Relu into its loop
    (residual Add + Relu); any other activation is a second pass over ``out``, still in cache.
    When both operands repeat along the row (one element each), the one result fills it.
    """
    if x.shape[0] == 1 and y.shape[0] == 1 and out.shape[0] > 1:
        v = _apply(op, x[0], y[0])
        v = _relu(v, True) if code == RELU else activate(v, code, alpha, beta)
        for j in range(out.shape[0]):
            out[j] = v
        return
    if op == ADD and code == RELU:
        _commutative(x, y, out, ADD, True)
        return
    if op == ADD:
        _commutative(x, y, out, ADD, False)
    elif op == MUL:
        _commutative(x, y, out, MUL, False)
    elif op == SUB:
        _ordered(x, y, out, SUB)
    elif op == DIV:
        _ordered(x, y, out, DIV)
    elif op >= POW:
        _pow_max_min(x, y, out, op)
    else:
        for j in range(out.shape[0]):
            out[j] = x[j]
    if code == RELU:
        for j in range(out.shape[0]):
            out[j] = _relu(out[j], True)
    elif code != NONE:
        for j in range(out.shape[0]):
            out[j] = activate(out[j], code, alpha, beta)


@njit(nogil=True, cache=True, error_model="numpy")
def _binary_rows(
    a, a_strides, a_step, b, b_strides, b_step, out, outer, inner, first, last, op, code, alpha, beta
):
    """Rows ``first`` to ``last`` (one slice of the window)."""
    size = out.shape[0]
    for r in range(first, last):
        lo = r * inner
        n = min(inner, size - lo)
        ai = row_offset(r, outer, a_strides)
        bi = row_offset(r, outer, b_strides)
        x = a[ai : ai + (n if a_step else 1)]
        y = b[bi : bi + (n if b_step else 1)]
        _segment(x, y, out[lo : lo + n], op, code, alpha, beta)


# The parallel region only hands out slices: numba compiles a parallel loop's body slowly,
# so the work lives in plain functions.
@njit(parallel=True, nogil=True, cache=True)
def _binary(a, a_strides, a_step, b, b_strides, b_step, out, outer, inner, bounds, op, code, alpha, beta):
    if bounds.shape[0] == 2:  # one slice: no parallel region
        _binary_rows(
            a, a_strides, a_step, b, b_strides, b_step,
            out, outer, inner, bounds[0], bounds[1], op, code, alpha, beta,
        )  # fmt: skip
        return
    for s in prange(bounds.shape[0] - 1):
        _binary_rows(
            a, a_strides, a_step, b, b_strides, b_step,
            out, outer, inner, bounds[s], bounds[s + 1], op, code, alpha, beta,
        )  # fmt: skip


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
        _binary(
            a, self.a_strides, self.a_step, b, self.b_strides, self.b_step,
            out, self.outer, self.inner, self.bounds, op, code, alpha, beta,
        )  # fmt: skip


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
        # Constant operands (a Pow's exponent, a bias), copied once into writable arrays:
        # numba types a read-only array apart, and would compile the whole walk for it again.
        self.constants = [None if c is None else np.array(c, np.float32, order="C") for c in info.constants]
        self._walks: dict[tuple, BroadcastWalk] = {}

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
        shape = np.broadcast_shapes(*(x.shape for x in arrays))
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
