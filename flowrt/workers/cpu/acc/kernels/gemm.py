"""Gemm and MatMul: BLAS on blocks of the output, one block per slice.

The window is (batch, M, N). Each batch entry is one task when there are enough of them;
otherwise its rows (M) or its columns (N) are split, whichever is longer. Every slice calls
single-threaded BLAS on its own block, transposed operands and all (no copies), then adds
``beta * C`` and applies the fused activation to that block while it is in cache.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np
from numba import njit

from flowrt.engine.memory.weights import MANAGER
from flowrt.engine.scheduler.window import SplitHint, split_bounds
from flowrt.errors import ShapeError
from flowrt.registry import Support, WorkloadInfo
from flowrt.types import DataType
from flowrt.workers.cpu.acc import gemv, packed_gemm
from flowrt.workers.cpu.acc.blas import pin_scipy_blas, read_only, sgemm
from flowrt.workers.cpu.acc.calls import SliceFunction
from flowrt.workers.cpu.acc.half import to_half
from flowrt.workers.cpu.acc.kernels import acc_kernel
from flowrt.workers.cpu.acc.kernels.epilogue import NO_BIAS, NONE, activate_row, activation_args
from flowrt.workers.cpu.acc.tile_ir import PANEL_LAYOUT

pin_scipy_blas()

# Fewest rows (or columns) of the output a slice should have to be worth its own BLAS call.
MIN_ROWS = 16
MIN_COLUMNS = 64

_NO_C = read_only(np.zeros((1, 1), np.float32))


@njit(nogil=True, cache=True)
def _gemm_task(
    task, step, a, a_index, b, b_index, y, trans_a, trans_b, alpha, c, beta, rows, cols, finish, code, act_a, act_b
):  # fmt: skip
    """One task of :func:`batched_gemm` (a :class:`SliceFunction`): one (entry, row slice,
    column slice) block."""
    row_slices, col_slices = rows.shape[0] - 1, cols.shape[0] - 1
    t, block_index = divmod(task, row_slices * col_slices)
    i, j = divmod(block_index, col_slices)
    r0, r1, c0, c1 = rows[i], rows[i + 1], cols[j], cols[j + 1]
    left = a[a_index[t]]
    right = b[b_index[t]]
    block = y[t, r0:r1, c0:c1]
    sgemm(
        trans_a,
        trans_b,
        alpha,
        left[:, r0:r1] if trans_a else left[r0:r1],
        right[c0:c1] if trans_b else right[:, c0:c1],
        0.0,
        block,
    )
    if finish:
        for r in range(r1 - r0):
            c_row = c[min(r0 + r, c.shape[0] - 1)]
            out_row = block[r]
            for k in range(c1 - c0):
                out_row[k] = out_row[k] + beta * c_row[min(c0 + k, c.shape[1] - 1)]
            if code != NONE:  # a pass of its own, each curve's loop vectorized
                activate_row(out_row, out_row, NO_BIAS, code, act_a, act_b)


_GEMM_TASK = SliceFunction(_gemm_task)


def batched_gemm(
    a, a_index, b, b_index, y, trans_a, trans_b, alpha, c, beta, rows, cols, finish, code, act_a, act_b
) -> None:
    """``y[t] = activation(alpha * op(a[a_index[t]]) @ op(b[b_index[t]]) + beta * c)`` for every
    batch entry t, one task per (entry, row slice, column slice); ``c`` is (1 or M, 1 or N).
    A single task runs on the calling thread, with no parallel region."""
    tasks = y.shape[0] * (rows.shape[0] - 1) * (cols.shape[0] - 1)
    args = (a, a_index, b, b_index, y, trans_a, trans_b, alpha, c, beta, rows, cols, finish, code, act_a, act_b)  # fmt: skip
    _GEMM_TASK.run(tasks, args)


class _Split(NamedTuple):
    rows: np.ndarray
    cols: np.ndarray


def plan_split(batch: int, m: int, n: int, workers: int) -> _Split:
    """Row and column boundaries of each batch entry's blocks: whole when the batch alone
    feeds every worker, else split along the longer of M and N."""
    whole_rows, whole_cols = np.array([0, m], np.int64), np.array([0, n], np.int64)
    if batch >= workers:
        return _Split(whole_rows, whole_cols)
    share = -(-workers // batch)
    if m >= n:
        return _Split(split_bounds(m, SplitHint(axis=1, min_slice=MIN_ROWS), share), whole_cols)
    return _Split(whole_rows, split_bounds(n, SplitHint(axis=2, min_slice=MIN_COLUMNS), share))


# Below this many multiply-adds a product runs as one slice, on the calling thread (65536: a
# few microseconds of one core, where a region starts on CpuAcc's team in about one).
MIN_PARALLEL_WORK = 1 << 16


class _Packed:
    """A product by constant weights ``w`` (K, N), with its plans: by :mod:`packed_gemm`'s
    panels for more than ``gemv.MAX_VECTORS`` rows, by :func:`gemv.gemv` over the weights'
    rows for fewer. Each form is made on its first product (a network run at batch 1 never
    packs panels), and ``w`` itself is the layer's constant, or a view of it, not a copy:
    vgg19's fully connected weights (0.5 GiB) were held four times at load. With ``half``
    the forms hold float16 (``half.py``): half the bytes, read and widened by the kernels."""

    def __init__(
        self,
        w: np.ndarray,
        bias: np.ndarray | None,
        workers: int,
        source: np.ndarray,
        form: tuple,
        half: bool = False,
    ) -> None:
        self.k, self.n = w.shape
        self.workers = workers
        self.half = half
        # the layer's constant and how ``w`` is made of it: the panels and rows made of
        # ``w`` are shared with every other load of that constant (engine/memory/weights.py)
        self._source, self._form = source, (*form, "float16") if half else form
        self._plans: dict[int, packed_gemm.Plan] = {}
        self._w, self._bias = w, bias
        self._panels: packed_gemm.PackedWeights | None = None
        self._rows: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None

    @property
    def weights(self) -> packed_gemm.PackedWeights:
        """The weights packed into panels (on the first product of many rows)."""
        if self._panels is None:
            panels = MANAGER.shared(
                self._source,
                "gemm.panels",
                (self._form, PANEL_LAYOUT),
                lambda: packed_gemm.column_panels(self._w, self.half),
                lasting=True,
            )
            self._panels = packed_gemm.PackedWeights(
                panels, packed_gemm.column_bias(panels, self._bias), self.n
            )
        return self._panels

    def _by_rows(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The weights as (N, K) rows, the bias as N values and the rows' split over the
        workers, for :func:`gemv.gemv` (made on the first product of few rows)."""
        if self._rows is None:
            n = self.n
            rows = MANAGER.shared(
                self._source,
                "gemm.rows",
                self._form,
                self._make_rows,
                lasting=True,
            )
            bias = np.zeros(n, np.float32) if self._bias is None else np.broadcast_to(self._bias, (n,))
            self._rows = (
                rows,
                read_only(np.ascontiguousarray(bias, np.float32)),
                gemv.row_bounds(n, self.k, self.workers),
            )
        return self._rows

    def _make_rows(self) -> np.ndarray:
        """The weights as (N, K) rows: float16 with ``half``, unless the float32 rows are the
        constant itself (a Gemm's B with transB), which then serves as it is: a float16 copy
        would be memory beside it, not instead of it."""
        rows = self._w.T
        if self.half and not (rows.flags.c_contiguous and rows.dtype == np.float32):
            return to_half(rows)
        return read_only(np.ascontiguousarray(rows, np.float32))

    def make_forms(self, m: int) -> None:
        """Make the form of the weights a product of ``m`` rows takes, without running."""
        if m <= gemv.MAX_VECTORS:
            self._by_rows()
        else:
            _ = self.weights

    def run(self, a: np.ndarray, out: np.ndarray, code: int, act_a, act_b) -> None:
        """``out = activation(a @ w + bias)``; ``a`` (M, K), ``out`` (M, N) row-major."""
        m = a.shape[0]
        if m <= gemv.MAX_VECTORS:
            rows, bias, bounds = self._by_rows()
            gemv.gemv(rows, a, bias, out, bounds, code, act_a, act_b)
            return
        split = self._plans.get(m)
        if split is None:
            workers = self.workers if m * self.k * self.n >= MIN_PARALLEL_WORK else 1
            split = self._plans[m] = packed_gemm.plan(m, self.weights, workers)
        packed_gemm.multiply(a, self.weights, out, split, code, act_a, act_b)


def _float32_only(info: WorkloadInfo, kind: str) -> Support:
    if any(t is not None and t.dtype is not DataType.FLOAT32 for t in info.inputs):
        return Support.no(f"CpuAcc {kind} takes float32 only")
    return Support.yes()


def _matrix(x) -> np.ndarray:
    return read_only(np.ascontiguousarray(x, np.float32))


@acc_kernel("Gemm")
class GemmKernel:
    """Y = activation(alpha * A' @ B' + beta * C), A' and B' optionally transposed, C broadcast."""

    split_hint = SplitHint(axis=1, min_slice=MIN_ROWS)

    @classmethod
    def supports(cls, info: WorkloadInfo) -> Support:
        return _float32_only(info, "Gemm")

    def __init__(self, info: WorkloadInfo, workers: int) -> None:
        self.desc = info.descriptor
        self.workers = workers
        self.code, self.act_a, self.act_b = activation_args(info.activation)
        constants = tuple(info.constants) + (None,) * 3
        self.b = None if constants[1] is None else _matrix(constants[1])
        self.c = None if constants[2] is None else self._as_c(constants[2])
        self._splits: dict[tuple[int, int], _Split] = {}
        self.packed = self._pack(info, constants[2]) if packed_gemm.AVAILABLE else None
        if self.packed is not None:
            self.b = None  # the packed copy serves every run

    def _pack(self, info: WorkloadInfo, c) -> _Packed | None:
        """Constant B packed as ``alpha * op(B)``, with ``beta * C`` as its bias where C is
        constant and one row (or absent, or beta 0); None where the run must use BLAS."""
        desc = self.desc
        if self.b is None or self.b.ndim != 2:
            return None
        n = self.b.shape[0] if desc.transB else self.b.shape[1]
        bias = None
        if c is not None and desc.beta != 0:
            row = self._as_c(c)
            if row.shape[0] != 1 or (not desc.broadcasts_c and row.shape != (1, n)):
                return None
            bias = np.broadcast_to(np.float32(desc.beta) * row[0], (n,))
        elif len(info.inputs) > 2 and info.inputs[2] is not None and desc.beta != 0:
            return None  # C comes with each run
        w = self.b.T if desc.transB else self.b  # float32 already (_matrix): a view, no copy
        if desc.alpha != 1:
            w = w * np.float32(desc.alpha)
        form = ("gemm", desc.transB, desc.alpha)
        return _Packed(w, bias, self.workers, self.b, form, info.fp16_weights)

    @staticmethod
    def _as_c(c) -> np.ndarray:
        """C as a (1 or M, 1 or N) float32 matrix."""
        c = _matrix(c)
        return c.reshape((1,) * (2 - c.ndim) + c.shape)

    def make_forms(self, shapes: Sequence[tuple[int, ...] | None], job: Any = None) -> None:
        """Make the packed weights' form a run on inputs of ``shapes`` takes, without running."""
        if self.packed is not None and shapes[0] is not None and len(shapes[0]) == 2:
            self.packed.make_forms(shapes[0][1] if self.desc.transA else shapes[0][0])

    def execute(self, inputs, outputs=None):
        desc = self.desc
        a = _matrix(inputs[0])
        if self.packed is not None:
            a = np.ascontiguousarray(a.T) if desc.transA else a
            out = np.empty((a.shape[0], self.packed.n), np.float32) if outputs is None else outputs[0]
            self.packed.run(a, out, self.code, self.act_a, self.act_b)
            return [out]
        b = self.b if self.b is not None else _matrix(inputs[1])
        m = a.shape[1] if desc.transA else a.shape[0]
        n = b.shape[0] if desc.transB else b.shape[1]
        c = self.c
        if c is None and len(inputs) > 2 and inputs[2] is not None:
            if not desc.broadcasts_c and np.shape(inputs[2]) != (m, n):
                raise ShapeError(
                    f"Gemm (opset {desc.opset}, broadcast=0) expects C of shape {(m, n)}, "
                    f"got {np.shape(inputs[2])}"
                )
            c = self._as_c(inputs[2])
        if desc.beta == 0:
            c = None  # ONNX ignores C then (even where it holds inf or nan)
        beta = np.float32(desc.beta if c is not None else 0)
        out = np.empty((m, n), np.float32) if outputs is None else outputs[0]
        split = self._splits.get((m, n))
        if split is None:
            split = self._splits[(m, n)] = plan_split(1, m, n, self.workers)
        index = np.zeros(1, np.int64)
        batched_gemm(
            a[None], index, b[None], index, out.reshape(1, m, n), bool(desc.transA), bool(desc.transB),
            np.float32(desc.alpha), _NO_C if c is None else c, beta, split.rows, split.cols,
            beta != 0 or self.code != NONE, self.code, self.act_a, self.act_b,
        )  # fmt: skip
        return [out]


class _Batches(NamedTuple):
    """How a MatMul's operands map onto its output batch entries."""

    a_index: np.ndarray
    b_index: np.ndarray
    out_shape: tuple[int, ...]
    split: _Split
    rows: int  # rows of each entry's product: A's batch rows folded in when B is one matrix


@acc_kernel("MatMul")
class MatMulKernel:
    """numpy's matmul: 1-D operands promoted, batch dims broadcast. MatMulBias (A by a
    matrix, plus a vector along its columns) is one with the bias added as it is stored."""

    split_hint = SplitHint(axis=0, min_slice=1)

    @classmethod
    def supports(cls, info: WorkloadInfo) -> Support:
        return _float32_only(info, "MatMul")

    def __init__(self, info: WorkloadInfo, workers: int) -> None:
        self.workers = workers
        self.code, self.act_a, self.act_b = activation_args(info.activation)
        constants = tuple(info.constants) + (None,) * 2
        self.b = None if constants[1] is None else _matrix(constants[1])
        self._plans: dict[tuple[tuple[int, ...], tuple[int, ...]], _Batches] = {}
        self.packed = None
        self.with_bias = info.kind == "MatMulBias"
        bias = constants[2] if self.with_bias and len(constants) > 2 else None
        if (
            packed_gemm.AVAILABLE
            and self.b is not None
            and self.b.ndim == 2
            and (bias is not None or not self.with_bias)
        ):
            self.packed = _Packed(
                self.b,
                None if bias is None else _matrix(bias),
                workers,
                self.b,
                ("matmul",),
                info.fp16_weights,
            )
            self.weights_shape, self.b = self.b.shape, None  # the packed copy serves every run

    def plan(self, a_shape: tuple[int, ...], b_shape: tuple[int, ...]) -> _Batches:
        """Batch index maps and the split for one pair of shapes (computed once per pair)."""
        cached = self._plans.get((a_shape, b_shape))
        if cached is not None:
            return cached
        a2 = (1, *a_shape) if len(a_shape) == 1 else a_shape
        b2 = (*b_shape, 1) if len(b_shape) == 1 else b_shape
        if a2[-1] != b2[-2]:
            raise ShapeError(
                f"MatMul expects A's last dim to equal B's row count, got {a_shape} and {b_shape}"
            )
        batch = np.broadcast_shapes(a2[:-2], b2[:-2])
        m, n = a2[-2], b2[-1]
        out_shape = (*batch, *((m,) if len(a_shape) > 1 else ()), *((n,) if len(b_shape) > 1 else ()))

        def index(operand_batch: tuple[int, ...]) -> np.ndarray:
            entries = np.arange(int(np.prod(operand_batch)), dtype=np.int64).reshape(operand_batch)
            return np.ascontiguousarray(np.broadcast_to(entries, batch).reshape(-1))

        if len(b_shape) == 2 and len(a_shape) > 2:
            # One matrix B for every entry (a Linear layer on a sequence, a 1x1 conv written
            # as MatMul): A's entries stack into one tall product, one GEMM instead of many.
            rows = int(np.prod(a_shape[:-1]))
            whole = np.zeros(1, np.int64)
            cached = _Batches(whole, whole, out_shape, plan_split(1, rows, n, self.workers), rows)
        else:
            count = int(np.prod(batch))
            cached = _Batches(
                index(a2[:-2]), index(b2[:-2]), out_shape, plan_split(count, m, n, self.workers), m
            )
        self._plans[(a_shape, b_shape)] = cached
        return cached

    def make_forms(self, shapes: Sequence[tuple[int, ...] | None], job: Any = None) -> None:
        """Make the packed weights' form a run on inputs of ``shapes`` takes, without running."""
        if self.packed is not None and shapes[0] is not None and len(shapes[0]) >= 1:
            self.packed.make_forms(int(np.prod(shapes[0][:-1])))

    def execute(self, inputs, outputs=None):
        a = _matrix(inputs[0])
        if self.packed is not None:
            k, n = self.weights_shape
            if a.shape[-1] != k:
                raise ShapeError(
                    f"MatMul expects A's last dim to equal B's row count, got {a.shape} and {(k, n)}"
                )
            out = np.empty((*a.shape[:-1], n), np.float32) if outputs is None else outputs[0]
            self.packed.run(a.reshape(-1, k), out.reshape(-1, n), self.code, self.act_a, self.act_b)
            return [out]
        b = self.b if self.b is not None else _matrix(inputs[1])
        plan = self.plan(a.shape, b.shape)
        out = np.empty(plan.out_shape, np.float32) if outputs is None else outputs[0]
        k = a.shape[-1]
        a3 = a.reshape(-1, plan.rows, k)
        b3 = b.reshape(-1, k, 1 if b.ndim == 1 else b.shape[-1])
        y3 = out.reshape(-1, plan.rows, b3.shape[2])
        bias = _matrix(inputs[2]).reshape(1, -1) if self.with_bias else _NO_C
        batched_gemm(
            a3, plan.a_index, b3, plan.b_index, y3, False, False, np.float32(1), bias,
            np.float32(1 if self.with_bias else 0), plan.split.rows, plan.split.cols,
            self.with_bias or self.code != NONE, self.code, self.act_a, self.act_b,
        )  # fmt: skip
        return [out]


@acc_kernel("MatMulBias")
class MatMulBiasKernel(MatMulKernel):
    """MatMul's kernel with the bias added as each product is stored (A, B and a bias: a
    residual Z, which GpuAcc fuses, is not added here)."""

    @classmethod
    def supports(cls, info: WorkloadInfo) -> Support:
        if len(info.inputs) != 3 or info.inputs[2] is None:
            return Support.no("CpuAcc MatMulBias takes A, B and a bias, no residual Z")
        return _float32_only(info, "MatMulBias")
