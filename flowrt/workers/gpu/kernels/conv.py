"""2-D Conv as im2col + the tiled GEMM, with groups, bias and the activation fused into the GEMM.

The column matrix of image n is (C * KH * KW, OH * OW); group g's rows are one contiguous
block of it, so batch ``n * G + g`` of the GEMM multiplies group g's weights
(M / G, C / G * KH * KW) by that block and writes (M / G, OH * OW) at exactly its place in the
NCHW output. A 1x1 convolution with unit strides and no padding reads the input itself.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from flowrt.engine.graph.layers.conv import window_geometry
from flowrt.registry import Support, WorkloadInfo
from flowrt.types import static_dims
from flowrt.workers.gpu.kernels import GpuKernel, gpu_kernel, ints, static_shape
from flowrt.workers.gpu.kernels.gemm import Gemm, Operand
from flowrt.workers.gpu.tensor import GpuTensor


@gpu_kernel("Conv")
class ConvKernel(GpuKernel):
    """Conv over NCHW input and MCHW weights."""

    fuses_activation = True

    @classmethod
    def supports(cls, info: WorkloadInfo) -> Support:
        if len(static_shape(info.inputs[0])) != 4:
            return Support.no("GpuAcc runs 2-D convolutions only")
        return Support.yes()

    def prepare(self) -> None:
        x_shape, w_shape = static_shape(self.info.inputs[0]), static_shape(self.info.inputs[1])
        self.kernel_hw = w_shape[2:]
        self.geometry = window_geometry(self.info.descriptor, x_shape[2:], self.kernel_hw)
        self.out_hw = static_dims(self.geometry.out)
        g = self.geometry
        n, c = x_shape[:2]
        m, groups = w_shape[0], self.info.descriptor.group
        pixels = math.prod(self.out_hw)
        self.gemm = Gemm(self, (m // groups, pixels, (c // groups) * math.prod(self.kernel_hw)), n * groups)
        self.direct = (
            self.kernel_hw == (1, 1)
            and g.strides == (1, 1)
            and not any(g.pads_begin)
            and tuple(g.out) == x_shape[2:]
        )
        if not self.direct:
            self.im2col = self.context.kernel("conv", "im2col")

    def enqueue(self, queue: Any, inputs: Sequence[GpuTensor | None], outputs: Sequence[GpuTensor]) -> Any:
        x, w, *rest = inputs
        assert x is not None and w is not None  # required inputs; only the bias is optional
        bias = rest[0] if rest else None
        n, c, h, wid = x.shape
        m, groups = w.shape[0], self.info.descriptor.group
        (oh, ow), (kh, kw) = self.out_hw, self.kernel_hw
        cells = (c // groups) * kh * kw
        pixels = oh * ow
        cols = x if self.direct else self._columns(queue, x, n * c * kh * kw * pixels)
        return self.gemm.enqueue(
            queue,
            Operand(w, cells, 1, (m // groups) * cells),
            Operand(cols, pixels, 1, cells * pixels),
            outputs[0],
            Operand(bias, 1, 0, m // groups) if bias is not None else None,
            groups=groups, activation=self.info.activation,
        )  # fmt: skip

    def _columns(self, queue: Any, x: GpuTensor, total: int) -> GpuTensor:
        """The im2col matrix of ``x`` (enqueued; the GEMM after it on the queue reads it)."""
        g = self.geometry
        cols = self.context.scratch((total,))
        self.launch(
            self.im2col, queue, total, *x.kernel_args, *cols.kernel_args,
            *ints(x.shape[1], *x.shape[2:], *self.kernel_hw, *self.out_hw, *g.strides, *g.pads_begin,
                  *g.dilations, total),
        )  # fmt: skip
        return cols
