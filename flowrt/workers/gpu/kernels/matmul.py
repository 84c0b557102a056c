"""MatMul with numpy's batch rules, and MatMulBias, on gemm.cl's tiled GEMM (through :class:`Gemm`).

A (..., M, K) @ B (..., K, N): when only A has batch dims they fold into M (one GEMM of
batch * M rows); when only B has them, each batch multiplies the one A; when both have the
same batch dims, batch b multiplies A[b] by B[b] (A read at ``group`` b). A 1-D operand is
a row (A) or a column (B), and the output drops that dim, as numpy does.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from flowrt.registry import Support, WorkloadInfo
from flowrt.workers.gpu.kernels import GpuKernel, contiguous_strides, fold_dims, gpu_kernel, static_shape
from flowrt.workers.gpu.kernels.gemm import Gemm, Operand
from flowrt.workers.gpu.tensor import GpuTensor


def matmul_plan(a_shape: Sequence[int], b_shape: Sequence[int]) -> tuple[int, int, int, int, int, int] | None:
    """(M, N, K, batches, A's batch count, B's batch count) of ``a @ b``; None when the
    batch dims broadcast other than as the module docstring says."""
    a = (1, *a_shape) if len(a_shape) == 1 else tuple(a_shape)
    b = (*b_shape, 1) if len(b_shape) == 1 else tuple(b_shape)
    a_batch, b_batch = math.prod(a[:-2]), math.prod(b[:-2])
    m, k, n = a[-2], a[-1], b[-1]
    if a_batch > 1 and b_batch > 1 and a[:-2] != b[:-2]:
        padded = (1,) * (len(b) - len(a)) + a[:-2]
        if padded != (1,) * (len(a) - len(b)) + b[:-2]:
            return None
    if b_batch == 1:  # A's batch dims (if any) fold into its rows
        return m * a_batch, n, k, 1, 1, 1
    return m, n, k, b_batch, a_batch, b_batch


@gpu_kernel("MatMul")
class MatMulKernel(GpuKernel):
    """Y = A @ B, with batch dims."""

    fuses_activation = True
    half_storage = True

    @classmethod
    def supports(cls, info: WorkloadInfo) -> Support:
        a, b = (static_shape(x) for x in info.inputs[:2])
        if matmul_plan(a, b) is None:
            return Support.no(
                f"GpuAcc's MatMul takes equal batch dims or batch dims on one side only; "
                f"got shapes {a} and {b}"
            )
        return Support.yes()

    def prepare(self) -> None:
        a, b = (static_shape(x) for x in self.info.inputs[:2])
        plan = matmul_plan(a, b)
        assert plan is not None  # supports() declines the shapes with none
        self.plan = plan
        m, n, k, batches, _, _ = plan
        self.gemm = Gemm(self, (m, n, k), batches)

    def enqueue(self, queue: Any, inputs: Sequence[Any], outputs: Sequence[GpuTensor]) -> Any:
        a, b = inputs[:2]
        m, n, k, batches, a_batches, _ = self.plan
        return self.gemm.enqueue(
            queue, Operand(a, k, 1, m * k), Operand(b, n, 1, k * n), outputs[0],
            groups=batches if a_batches > 1 else 1, activation=self.info.activation,
        )  # fmt: skip


@gpu_kernel("MatMulBias")
class MatMulBiasKernel(MatMulKernel):
    """Y = A @ B + bias [+ Z]: the rows of A (any rank) by the matrix B, plus a vector along
    the columns (absent: None) and a residual Z of Y's shape, added in the GEMM's epilogue (a
    transformer's projections and residual connections, fused from MatMul + Add + Add)."""

    def enqueue(self, queue: Any, inputs: Sequence[Any], outputs: Sequence[GpuTensor]) -> Any:
        a, b, bias, z = (list(inputs) + [None, None])[:4]
        m, n, k, *_ = self.plan
        return self.gemm.enqueue(
            queue, Operand(a, k, 1, m * k), Operand(b, n, 1, k * n), outputs[0],
            None if bias is None else Operand(bias, 0, 1), activation=self.info.activation, residual=z,
        )  # fmt: skip


def _as_read(shape: Sequence[int], perm: Sequence[int] | None) -> tuple[list[int], list[int]]:
    """(the shape, the element strides) of a row-major tensor of ``shape`` read transposed by
    ``perm`` (None: as it is)."""
    strides = contiguous_strides(shape)
    order = list(perm) if perm is not None else list(range(len(shape)))
    return [shape[p] for p in order], [strides[p] for p in order]


def _batch_steps(shape: Sequence[int], strides: Sequence[int], whose: str, how: str) -> tuple[int, ...] | str:
    """A batched matrix's (rows, cols, step, heads, head_step) as gemm.cl steps over it: the
    batch dims in at most two runs of strides (the outer run's step, then the inner run's
    count and step); else why not."""
    runs = fold_dims(shape[:-2], strides[:-2])
    if len(runs) > 2:
        return f"{whose} batch dims {list(shape[:-2])} in at most two runs of strides, {how} with {list(strides[:-2])}"
    if len(runs) == 2:
        (_, step), (heads, head_step) = runs
        return (strides[-2], strides[-1], step, heads, head_step)
    return (strides[-2], strides[-1], runs[0][1] if runs else 0, 1, 0)


def _rows_steps(shape: Sequence[int], strides: Sequence[int], whose: str, how: str) -> tuple[int, ...] | str:
    """One matrix whose batch dims fold into its rows: (rows, cols, 0, 1, 0); else why not
    (they must make one run of strides with the rows)."""
    rows = fold_dims(shape[:-1], strides[:-1])
    if len(rows) > 1:
        return f"{whose} batch dims and rows {list(shape[:-1])} in one run of strides, {how} with {list(strides[:-1])}"
    return (rows[0][1] if rows else 0, strides[-1], 0, 1, 0)


def transposed_layout(
    a_shape: Sequence[int], perm_a: Sequence[int] | None, b_shape: Sequence[int], perm_b: Sequence[int] | None
) -> tuple[tuple[int, int, int, int, int], tuple[int, ...], tuple[int, ...]] | str:
    """How gemm.cl reads ``Transpose(A, perm_a) @ Transpose(B, perm_b)``: ((M, N, K, batches,
    groups), A's and B's operand strides (rows, cols, step, heads, head_step)); else why it
    cannot (each operand's batch dims must fold into two levels of steps, and A's rows, where its
    batch folds into them, into one)."""
    (a, ta), (b, tb) = _as_read(a_shape, perm_a), _as_read(b_shape, perm_b)
    if len(a) < 2 or len(b) < 2:
        return f"operands of rank 2 or more, read as {a} and {b}"
    plan = matmul_plan(a, b)
    if plan is None:
        return f"equal batch dims or batch dims on one side only, read as {a} and {b}"
    m, n, k, batches, a_batches, _ = plan
    if batches == 1:  # A's batch dims, if any, fold into its rows
        a_read: tuple[int, ...] | str = _rows_steps(a, ta, "A's", "read")
        b_read: tuple[int, ...] | str = (tb[-2], tb[-1], 0, 1, 0)
    else:
        a_read = _batch_steps(a, ta, "A's", "read") if a_batches > 1 else (ta[-2], ta[-1], 0, 1, 0)
        b_read = _batch_steps(b, tb, "B's", "read")
    for read in (a_read, b_read):
        if isinstance(read, str):
            return read
    groups = batches if batches > 1 and a_batches > 1 else 1  # A read per batch, or one A for all
    return (m, n, k, batches, groups), a_read, b_read  # type: ignore[return-value]  # both tuples by now


def written_layout(
    a_shape: Sequence[int], perm_a: Sequence[int] | None, b_shape: Sequence[int], perm_b: Sequence[int] | None,
    perm_y: Sequence[int],
) -> tuple[int, ...] | str:  # fmt: skip
    """Where gemm.cl's C_STRIDES build writes ``Transpose(A' @ B', perm_y)`` (A' and B' the
    operands as read): C's strides (rows, cols, step, heads, head_step) in the transposed
    result; else why it cannot (the batch dims must fold into two levels of steps, or, where
    A's batch folds into its rows, into the rows' one run)."""
    (a, _), (b, _) = _as_read(a_shape, perm_a), _as_read(b_shape, perm_b)
    plan = matmul_plan(a, b)
    if len(a) < 2 or len(b) < 2 or plan is None:
        return f"operands of rank 2 or more, read as {a} and {b}"
    product = [*np.broadcast_shapes(tuple(a[:-2]), tuple(b[:-2])), a[-2], b[-1]]
    ys = contiguous_strides([product[p] for p in perm_y])
    strides = [ys[list(perm_y).index(i)] for i in range(len(product))]
    if plan[3] == 1:  # one batch: A's batch dims, if any, fold into the rows
        return _rows_steps(product, strides, "the product's", "written")
    return _batch_steps(product, strides, "the product's", "written")


@gpu_kernel("TransposedMatMul")
class TransposedMatMulKernel(GpuKernel):
    """Transpose(alpha * Transpose(A, perm_a) @ Transpose(B, perm_b), perm_y) in one GEMM launch,
    A and B read through their permuted strides (:func:`transposed_layout`) and the product
    written through the permuted strides of the result (:func:`written_layout`): attention's
    Q K^T and P V straight from the head splits' (batch, seq, heads, depth) tensors, and P V's
    heads merged back into the sequence's rows as they are computed."""

    fuses_activation = True
    half_storage = True

    @classmethod
    def supports(cls, info: WorkloadInfo) -> Support:
        desc = info.descriptor
        a, b = static_shape(info.inputs[0]), static_shape(info.inputs[1])
        layout = transposed_layout(a, desc.perm_a, b, desc.perm_b)
        if isinstance(layout, str):
            return Support.no(f"GpuAcc's TransposedMatMul reads {layout}")
        if desc.perm_y is not None:
            write = written_layout(a, desc.perm_a, b, desc.perm_b, desc.perm_y)
            if isinstance(write, str):
                return Support.no(f"GpuAcc's TransposedMatMul writes {write}")
        return Support.yes()

    def prepare(self) -> None:
        desc = self.info.descriptor
        a, b = static_shape(self.info.inputs[0]), static_shape(self.info.inputs[1])
        layout = transposed_layout(a, desc.perm_a, b, desc.perm_b)
        assert not isinstance(layout, str)  # supports() declines the others
        (m, n, k, batches, self.groups), self.a_read, self.b_read = layout
        write = None if desc.perm_y is None else written_layout(a, desc.perm_a, b, desc.perm_b, desc.perm_y)
        assert not isinstance(write, str)  # supports() declines the others
        self.c_write = write
        two_levels = self.a_read[3] > 1 or self.b_read[3] > 1
        self.gemm = Gemm(self, (m, n, k), batches, head_steps=two_levels, strided_c=write is not None)

    def enqueue(self, queue: Any, inputs: Sequence[Any], outputs: Sequence[GpuTensor]) -> Any:
        a, b = inputs[:2]
        y = outputs[0]
        return self.gemm.enqueue(
            queue, Operand(a, *self.a_read), Operand(b, *self.b_read), y,
            groups=self.groups, alpha=self.info.descriptor.alpha, activation=self.info.activation,
            c_write=None if self.c_write is None else Operand(y, *self.c_write),
        )  # fmt: skip
