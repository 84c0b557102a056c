"""Unary functions elementwise: Exp, Log, Sqrt, Erf, Gelu and the other one-input layers
that need no parameter tensor (elementwise.cl's ``unary``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from flowrt.workers.gpu.kernels import GpuKernel, gpu_kernel, ints
from flowrt.workers.gpu.tensor import GpuTensor

# The codes of elementwise.cl's unary_op(); Gelu's tanh approximation is code 13.
UNARY_CODES = {
    "Exp": 0, "Log": 1, "Sqrt": 2, "Neg": 3, "Abs": 4, "Reciprocal": 5, "Floor": 6, "Ceil": 7,
    "Round": 8, "Erf": 9, "Sin": 10, "Cos": 11, "Gelu": 12, "Elu": 14, "Softplus": 15,
    "Softsign": 16, "HardSigmoid": 17,
}  # fmt: skip


@gpu_kernel(*UNARY_CODES)
class UnaryKernel(GpuKernel):
    """y = f(x), one work-item per element."""

    half_storage = True

    def prepare(self) -> None:
        self.kernel = self.context.kernel("elementwise", "unary", self.storage)
        desc = self.info.descriptor
        code = UNARY_CODES[self.info.kind]
        if self.info.kind == "Gelu" and desc.approximate == "tanh":
            code = 13
        self.op = np.int32(code)
        self.params = (np.float32(getattr(desc, "alpha", 0.0)), np.float32(getattr(desc, "beta", 0.0)))

    def enqueue(self, queue: Any, inputs: Sequence[GpuTensor], outputs: Sequence[GpuTensor]) -> Any:
        x, y = inputs[0], outputs[0]
        return self.launch(
            self.kernel, queue, x.size, *x.kernel_args, *y.kernel_args, *ints(x.size), self.op, *self.params
        )
