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

    def batched(shape: list[int], strides: list[int], what: str) -> tuple[int, ...] | str:
        runs = fold_dims(shape[:-2], strides[:-2])
        if len(runs) > 2:
            return (
                f"{what}'s batch dims {shape[:-2]} in at most two runs of strides, read with {strides[:-2]}"
            )
        if len(runs) == 2:  # the outer run's step, then the inner run's count and step
            (_, step), (heads, head_step) = runs
            return (strides[-2], strides[-1], step, heads, head_step)
        return (strides[-2], strides[-1], runs[0][1] if runs else 0, 1, 0)

    if batches == 1:  # A's batch dims, if any, fold into its rows
        rows = fold_dims(a[:-1], ta[:-1])
        if len(rows) > 1:
            return f"A's batch dims and rows {a[:-1]} in one run of strides, read with {ta[:-1]}"
        a_read: tuple[int, ...] | str = (rows[0][1] if rows else 0, ta[-1], 0, 1, 0)
        b_read: tuple[int, ...] | str = (tb[-2], tb[-1], 0, 1, 0)
    else:
        a_read = batched(a, ta, "A") if a_batches > 1 else (ta[-2], ta[-1], 0, 1, 0)
        b_read = batched(b, tb, "B")
    for read in (a_read, b_read):
        if isinstance(read, str):
            return read
    groups = batches if batches > 1 and a_batches > 1 else 1  # A read per batch, or one A for all
    return (m, n, k, batches, groups), a_read, b_read  # type: ignore[return-value]  # both tuples by now


@gpu_kernel("TransposedMatMul")
class TransposedMatMulKernel(GpuKernel):
    """alpha * Transpose(A, perm_a) @ Transpose(B, perm_b) in one GEMM launch, A and B read through
    their permuted strides (:func:`transposed_layout`): attention's Q K^T and P V straight
    from the head splits' (batch, seq, heads, depth) tensors."""

    fuses_activation = True
    half_storage = True

    @classmethod
    def supports(cls, info: WorkloadInfo) -> Support:
        desc = info.descriptor
        layout = transposed_layout(
            static_shape(info.inputs[0]), desc.perm_a, static_shape(info.inputs[1]), desc.perm_b
        )
        if isinstance(layout, str):
            return Support.no(f"GpuAcc's TransposedMatMul reads {layout}")
        return Support.yes()

    def prepare(self) -> None:
        desc = self.info.descriptor
        layout = transposed_layout(
            static_shape(self.info.inputs[0]), desc.perm_a, static_shape(self.info.inputs[1]), desc.perm_b
        )
        assert not isinstance(layout, str)  # supports() declines the others
        (m, n, k, batches, self.groups), self.a_read, self.b_read = layout
        two_levels = self.a_read[3] > 1 or self.b_read[3] > 1
        self.gemm = Gemm(self, (m, n, k), batches, head_steps=two_levels)

    def enqueue(self, queue: Any, inputs: Sequence[Any], outputs: Sequence[GpuTensor]) -> Any:
        a, b = inputs[:2]
        return self.gemm.enqueue(
            queue, Operand(a, *self.a_read), Operand(b, *self.b_read), outputs[0],
            groups=self.groups, alpha=self.info.descriptor.alpha, activation=self.info.activation,
        )  # fmt: skip
