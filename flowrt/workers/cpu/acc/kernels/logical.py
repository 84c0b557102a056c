"""And, Or, Xor (broadcast like numpy) and Not on bool tensors: an attention mask's
combinations in transformer exports. Each is one numpy ufunc into the output; what CpuAcc
adds is that the layer stays in the CPU segment around it instead of crossing to CpuRef.
"""

from __future__ import annotations

import numpy as np

from flowrt.engine.graph.shapes import broadcast_shapes
from flowrt.errors import BackendError
from flowrt.registry import Support, WorkloadInfo
from flowrt.types import DataType, static_dims
from flowrt.workers.cpu.acc.kernels import acc_kernel

_UFUNCS = {"And": np.logical_and, "Or": np.logical_or, "Xor": np.logical_xor, "Not": np.logical_not}


@acc_kernel("And", "Or", "Xor", "Not")
class LogicalKernel:
    """One logical ufunc over bool operands, written into the output."""

    @classmethod
    def supports(cls, info: WorkloadInfo) -> Support:
        if any(t is None or t.dtype is not DataType.BOOL for t in info.inputs):
            return Support.no(f"CpuAcc {info.kind} takes bool inputs only")
        return Support.yes()

    def __init__(self, info: WorkloadInfo, workers: int) -> None:
        if info.activation is not None:
            raise BackendError(f"CpuAcc {info.kind} {info.layer_name!r} cannot apply a fused activation")
        self.info = info
        self.ufunc = _UFUNCS[info.kind]

    def execute(self, inputs, outputs=None):
        operands = [np.asarray(a, np.bool_) for a in inputs]
        # the operands' shapes checked here, not by numpy's broadcast (a ShapeError naming them)
        shape = static_dims(broadcast_shapes(*(a.shape for a in operands), where=self.info.kind))
        out = np.empty(shape, np.bool_) if outputs is None else outputs[0]
        self.ufunc(*operands, out=out)
        return [out]
