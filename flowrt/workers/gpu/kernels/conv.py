"""2-D Conv as an implicit GEMM, with groups, bias and the activation fused into the GEMM.

The column matrix of image n is (C * KH * KW, OH * OW); group g's rows are one contiguous
block of it, so batch ``n * G + g`` of the GEMM multiplies group g's weights
(M / G, C / G * KH * KW) by that block and writes (M / G, OH * OW) at exactly its place in the
NCHW output. The GEMM reads the column matrix from the image as it goes (gemm.cl's IMPLICIT
build), so no im2col pass writes it out; a 1x1 convolution with unit strides and no padding is
a plain GEMM over the input. A 3x3 stride-1 convolution runs by Winograd's F(2x2, 3x3)
instead where the cost model says it pays (``winograd.py``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from flowrt.engine.graph.layers.conv import window_geometry
from flowrt.registry import Support, WorkloadInfo
from flowrt.types import static_dims
from flowrt.workers.gpu.kernels import GpuKernel, gpu_kernel, static_shape
from flowrt.workers.gpu.kernels.gemm import Gemm, Operand
from flowrt.workers.gpu.kernels.winograd import Winograd, winograd_pays
from flowrt.workers.gpu.tensor import GpuTensor


@gpu_kernel("Conv", "FusedConv")
class ConvKernel(GpuKernel):
    """Conv over NCHW input and MCHW weights; FusedConv adds its residual Z in the GEMM's
    epilogue, before the activation."""

    fuses_activation = True
    half_storage = True

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
        n, c, h, w = x_shape
        groups = self.info.descriptor.group
        direct = (
            self.kernel_hw == (1, 1)
            and g.strides == (1, 1)
            and not any(g.pads_begin)
            and tuple(g.out) == x_shape[2:]
        )
        image = (
            None
            if direct
            else (h, w, *self.kernel_hw, self.out_hw[1], *g.strides, *g.pads_begin, *g.dilations)
        )
        self.cells = (c // groups) * math.prod(self.kernel_hw)
        self.group_step = (c // groups) * h * w  # group g of image i is batch i * G + g
        self.winograd: Winograd | None = None
        filters = self.constant(1)
        if filters is not None and self._winograd_fits(x_shape, w_shape):
            self.winograd = Winograd(self, x_shape, self.out_hw, g.pads_begin, np.asarray(filters))
            self.host_inputs = frozenset({1})  # the filters' transforms stand for them on the device
            return
        shape = (w_shape[0] // groups, math.prod(self.out_hw), self.cells)
        self.gemm = Gemm(self, shape, n * groups, image)

    def _winograd_fits(self, x_shape: tuple[int, ...], w_shape: tuple[int, ...]) -> bool:
        """A 3x3 stride-1 undilated convolution of one group, in float32, where F(2x2, 3x3)
        costs less than the implicit GEMM."""
        g = self.geometry
        if (
            self.kernel_hw != (3, 3)
            or g.strides != (1, 1)
            or g.dilations != (1, 1)
            or self.info.descriptor.group != 1
            or self.storage
        ):
            return False
        units = int(self.context.device.max_compute_units)
        return winograd_pays(x_shape, w_shape[0], self.out_hw, units)

    def enqueue(self, queue: Any, inputs: Sequence[GpuTensor | None], outputs: Sequence[GpuTensor]) -> Any:
        x, w, *rest = inputs
        assert x is not None and w is not None  # required inputs; only the bias is optional
        bias = rest[0] if rest else None
        residual = rest[1] if len(rest) > 1 else None
        if self.winograd is not None:
            return self.winograd.enqueue(queue, x, outputs[0], bias, residual, self.info.activation)
        m, pixels = self.gemm.shape[:2]
        return self.gemm.enqueue(
            queue,
            Operand(w, self.cells, 1, m * self.cells),
            Operand(x, pixels, 1, self.group_step),  # strides unused when implicit
            outputs[0],
            Operand(bias, 1, 0, m) if bias is not None else None,
            groups=self.info.descriptor.group, activation=self.info.activation, residual=residual,
        )  # fmt: skip
