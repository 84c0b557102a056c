"""Gemm on gemm.cl's tiled GEMM; :func:`enqueue_gemm` is shared with Conv and MatMul."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import attrs
import numpy as np

from flowrt.registry import FusedActivation
from flowrt.workers.gpu.kernels import GpuKernel, activation_args, gpu_kernel, ints
from flowrt.workers.gpu.tensor import GpuTensor

TILE, GROUP = 64, 16  # gemm.cl's TM = TN and WG


@attrs.frozen
class Operand:
    """A matrix read through strides: element (r, c) is ``tensor[r * rows + c * cols]`` (of
    its bytes, flat); ``step`` is how far apart consecutive batches (or groups, for A and the
    bias) lie."""

    tensor: GpuTensor
    rows: int
    cols: int
    step: int = 0


def enqueue_gemm(
    kernel: Any,
    queue: Any,
    shape: tuple[int, int, int],
    a: Operand,
    b: Operand,
    c: GpuTensor,
    bias: Operand | None = None,
    *,
    batches: int = 1,
    groups: int = 1,
    alpha: float = 1.0,
    beta: float = 1.0,
    activation: FusedActivation | None = None,
) -> Any:
    """Enqueue ``C[n] = act(alpha * A[n % groups] @ B[n] + beta * bias[n % groups])`` for each of
    ``batches`` batches (C packed, (M, N) per batch); ``shape`` is (M, N, K). Returns the event."""
    m, n, k = shape
    size = (-(-n // TILE) * GROUP, -(-m // TILE) * GROUP, batches)
    has_bias = bias is not None
    bias = bias or Operand(c, 0, 0)  # a placeholder the kernel never reads
    return kernel(
        queue, size, (GROUP, GROUP, 1),
        *ints(m, n, k, groups),
        *a.tensor.kernel_args, *ints(a.step, a.rows, a.cols),
        *b.tensor.kernel_args, *ints(b.step, b.rows, b.cols),
        *c.kernel_args, np.int32(m * n),
        *bias.tensor.kernel_args, *ints(has_bias, bias.step, bias.rows, bias.cols),
        np.float32(alpha), np.float32(beta), *activation_args(activation),
    )  # fmt: skip


def matrix(tensor: GpuTensor, transposed: bool) -> Operand:
    """A row-major 2-D tensor as an operand, read transposed when asked."""
    cols = tensor.shape[1]
    return Operand(tensor, 1, cols) if transposed else Operand(tensor, cols, 1)


def bias_operand(c: GpuTensor) -> Operand:
    """Gemm's C broadcast to the (M, N) product: stride 0 along its size-1 or missing dims."""
    shape = (1,) * (2 - len(c.shape)) + c.shape
    rows = shape[1] if shape[0] != 1 else 0
    return Operand(c, rows, 1 if shape[1] != 1 else 0)


class _MatrixProduct(GpuKernel):
    fuses_activation = True

    def prepare(self) -> None:
        self.kernel = self.context.kernel("gemm", "gemm")


@gpu_kernel("Gemm")
class GemmKernel(_MatrixProduct):
    """Y = act(alpha * A' @ B' + beta * C)."""

    def enqueue(self, queue: Any, inputs: Sequence[GpuTensor | None], outputs: Sequence[GpuTensor]) -> Any:
        a, b, *rest = inputs
        assert a is not None and b is not None  # required inputs; only C is optional
        desc = self.info.descriptor
        (m, n) = self.output_shapes[0]
        k = a.shape[0] if desc.transA else a.shape[1]
        y = outputs[0]
        c = rest[0] if rest and desc.beta != 0 else None
        bias = bias_operand(c) if c is not None else None
        return enqueue_gemm(
            self.kernel, queue, (m, n, k), matrix(a, desc.transA), matrix(b, desc.transB), y, bias,
            alpha=desc.alpha, beta=desc.beta, activation=self.info.activation,
        )  # fmt: skip
