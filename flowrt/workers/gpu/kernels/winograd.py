"""3x3 stride-1 Conv on GpuAcc by Winograd's F(2x2, 3x3) (winograd.cl): three launches, the
input's tiles transformed, 16 GEMMs over the channels in one (gemm.cl, a batch per tile
element), the tiles transformed back with bias, residual and activation.

It multiplies 16 / 36 of what the implicit GEMM does, for two more launches and the transformed
tiles' bytes (four times the input's and the output's): :func:`winograd_pays` weighs both with
the GEMM's cost model, so it takes the convolutions whose GEMM is large (ResNet-50's 3x3
layers at batch 8), not those bound by launches (the same layers at batch 1, 7x7 pixels).
F(2x2, 3x3)'s transforms add and subtract, and halve only the filters: its results are within
float32's rounding of the direct product's (ONNX Runtime's distance), so it needs no
``fast_math``. float32 layers only: a layer stored as half runs on the tensor cores.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from flowrt.engine.graph.winograd import winograd_weights
from flowrt.registry import FusedActivation
from flowrt.workers.gpu.kernels import GpuKernel, activation_args, ints
from flowrt.workers.gpu.kernels.gemm import TILINGS, Gemm, Operand, least_cost, transfer_cost
from flowrt.workers.gpu.tensor import GpuTensor

# The scratch slots of the transformed tiles V and the GEMMs' products M (a split K's partial
# sums take slot 0 meanwhile; see ``scratch``).
V_SLOT, M_SLOT = 3, 4
ELEMENTS = 16  # a 4x4 transformed tile
# A transform's cost per value read or written and compute unit, in the GEMM cost model's unit
# (about a thousand to a microsecond of an H200's device time, where resnet50's convolutions
# run): resnet50's transforms at batch 8 take 5 us a launch and 0.75 us more per million
# values. A launch is priced as a split K's reduction is, at what the host pays to enqueue it.
TRANSFORM_PER_FLOAT = 0.1


def tiles(out_hw: Sequence[int]) -> tuple[int, int]:
    """The 2x2 output tiles along each side."""
    return -(-out_hw[0] // 2), -(-out_hw[1] // 2)


def winograd_pays(x_shape: Sequence[int], outputs: int, out_hw: Sequence[int], units: int) -> bool:
    """Whether F(2x2, 3x3) costs less than the implicit GEMM for a 3x3 stride-1 convolution of
    an (N, C, H, W) input to ``outputs`` channels of ``out_hw`` on a device of ``units``
    compute units, by the GEMM's cost model: the 16 GEMMs and two transforms (each a launch
    and its values read and written) against the one GEMM."""
    n, c, h, w = x_shape
    th, tw = tiles(out_hw)
    p = n * th * tw
    pixels = out_hw[0] * out_hw[1]
    direct = least_cost((outputs, pixels, c * 9), n, units, TILINGS)
    transforms = transfer_cost(n * c * h * w + ELEMENTS * c * p, units, TRANSFORM_PER_FLOAT)
    transforms += transfer_cost(ELEMENTS * outputs * p + n * outputs * pixels, units, TRANSFORM_PER_FLOAT)
    return least_cost((outputs, p, c), ELEMENTS, units, TILINGS) + transforms < direct


class Winograd:
    """One convolution's F(2x2, 3x3): the filters' transforms on the device, the GEMMs'
    plan, the transforms' kernels."""

    def __init__(
        self,
        owner: GpuKernel,
        x_shape: Sequence[int],
        out_hw: Sequence[int],
        pads: Sequence[int],
        filters: np.ndarray,
    ) -> None:
        self.owner = owner
        n, c, h, w = x_shape
        self.outputs = int(filters.shape[0])
        self.tiles = tiles(out_hw)
        self.p = n * self.tiles[0] * self.tiles[1]
        self.image = ints(c, h, w, *pads, *self.tiles, self.p)
        self.geometry = ints(self.outputs, *out_hw, *self.tiles, self.p)
        self.channels = c
        self.u = owner.context.upload(winograd_weights(filters))  # (16, M, C)
        self.gemm = Gemm(owner, (self.outputs, self.p, c), ELEMENTS)
        storage = owner.storage
        self.forward = owner.context.kernel("winograd", "winograd_input", storage)
        self.back = owner.context.kernel("winograd", "winograd_output", storage)

    def enqueue(
        self,
        queue: Any,
        x: GpuTensor,
        y: GpuTensor,
        bias: GpuTensor | None,
        residual: GpuTensor | None,
        activation: FusedActivation | None,
    ) -> Any:
        """Enqueue the three launches writing ``y``; returns the last one's event."""
        context, c, m, p = self.owner.context, self.channels, self.outputs, self.p
        v = context.scratch((ELEMENTS, c, p), slot=V_SLOT, dtype=x.dtype)
        products = context.scratch((ELEMENTS, m, p), slot=M_SLOT, dtype=x.dtype)
        self.owner.launch(self.forward, queue, c * p, *self.image, *x.kernel_args, *v.kernel_args)
        self.gemm.enqueue(
            queue, Operand(self.u, c, 1, m * c), Operand(v, p, 1, c * p), products, groups=ELEMENTS
        )
        return self.owner.launch(
            self.back, queue, m * p, *self.geometry, *products.kernel_args, *y.kernel_args,
            *(bias or y).kernel_args, np.int32(bias is not None),
            *(residual or y).kernel_args, np.int32(residual is not None), *activation_args(activation),
        )  # fmt: skip
