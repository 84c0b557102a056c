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
from flowrt.workers.gpu.kernels import GpuKernel, gpu_kernel, static_shape
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
