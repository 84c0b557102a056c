"""Relu, LeakyRelu, Sigmoid, Tanh, HardSwish, Swish and Clip: common.cl's activate() over every
element (HardSigmoid alone is one of unary.py's functions).

:func:`enqueue_activation` is also how a workload applies a fused activation that its own
kernel does not.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from flowrt.engine.graph.layer_kind import activation_facts
from flowrt.registry import FusedActivation
from flowrt.workers.gpu.kernels import GpuKernel, activation_args, gpu_kernel
from flowrt.workers.gpu.tensor import GpuTensor


def enqueue_activation(
    owner: GpuKernel, kernel: Any, queue: Any, x: GpuTensor, y: GpuTensor, activation: FusedActivation
) -> Any:
    """Enqueue ``y = activation(x)`` (``y`` may be ``x``) on ``queue`` with the elementwise
    program's ``activation`` kernel, launched by ``owner``; returns its event."""
    return owner.launch(
        kernel,
        queue,
        x.size,
        *x.kernel_args,
        *y.kernel_args,
        np.int32(x.size),
        *activation_args(activation),
    )


@gpu_kernel("Relu", "LeakyRelu", "Sigmoid", "Tanh", "HardSwish", "Swish")
class ActivationKernel(GpuKernel):
    """One activation, elementwise; its alpha and beta as the activation table reads them."""

    half_storage = True

    def prepare(self) -> None:
        self.kernel = self.context.kernel("elementwise", "activation", self.storage)
        params = activation_facts()[self.info.kind].params(self.info.descriptor, self.info.constants)
        alpha, beta = params or (0.0, 0.0)
        self.activation = FusedActivation(self.info.kind, alpha, beta)

    def enqueue(self, queue: Any, inputs: Sequence[GpuTensor], outputs: Sequence[GpuTensor]) -> Any:
        return enqueue_activation(self, self.kernel, queue, inputs[0], outputs[0], self.activation)


@gpu_kernel("Clip")
class ClipKernel(GpuKernel):
    """Clip to [min, max], elementwise (common.cl's ACT_CLIP). The bounds are attributes
    before opset 11, else inputs 1 and 2, read on the host (absent: unbounded)."""

    host_inputs = frozenset({1, 2})
    half_storage = True

    def prepare(self) -> None:
        self.kernel = self.context.kernel("elementwise", "activation", self.storage)

    def bounds(self, inputs: Sequence[Any]) -> tuple[float, float]:
        desc = self.info.descriptor
        given = [desc.min, desc.max] if desc.opset < 11 else [*inputs[1:3], None, None][:2]
        low, high = (
            sign * np.inf if b is None else float(np.asarray(b).reshape(-1)[0])
            for b, sign in zip(given, (-1, 1))
        )
        return low, high

    def enqueue(self, queue: Any, inputs: Sequence[Any], outputs: Sequence[GpuTensor]) -> Any:
        low, high = self.bounds(inputs)
        return enqueue_activation(
            self, self.kernel, queue, inputs[0], outputs[0], FusedActivation("Clip", low, high)
        )
