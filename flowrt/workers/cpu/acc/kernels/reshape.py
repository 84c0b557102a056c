"""Reshape, Flatten, Squeeze and Unsqueeze: views of their input, no copy, any data type.

The memory planner gives these kinds no bytes of their own (``VIEW_KINDS``): the output is the
input seen with another shape. The shape logic is CpuRef's own kernels; CpuAcc takes these
layers so that they do not cut a chain of CpuAcc layers.
"""

from __future__ import annotations

from flowrt.registry import Support, WorkloadInfo
from flowrt.workers.cpu.acc.kernels import acc_kernel
from flowrt.workers.cpu.ref.kernels import reshape as ref

_REF = {"Reshape": ref.reshape, "Flatten": ref.flatten, "Squeeze": ref.squeeze, "Unsqueeze": ref.unsqueeze}


@acc_kernel(*_REF)
class ViewKernel:
    """The input with the layer's output shape; ``outputs`` are never given (they own no bytes)."""

    @classmethod
    def supports(cls, info: WorkloadInfo) -> Support:
        if info.inputs[0] is None:
            return Support.no(f"CpuAcc {info.kind} takes a present data input only")
        return Support.yes()

    def __init__(self, info: WorkloadInfo, workers: int) -> None:
        self.info = info
        self.view = _REF[info.kind]

    def execute(self, inputs, outputs=None):
        # A non-contiguous input is copied by numpy's reshape; every other input is viewed.
        return [self.view(self.info.descriptor, *inputs)]
