"""Reshape, Flatten, Squeeze and Unsqueeze: views of their input, no copy, any data type.

The memory planner gives these kinds no bytes of their own (``VIEW_KINDS``): the output is the
input seen with another shape. The shapes come from the layers' own module (``VIEW_SHAPES``),
as CpuRef's do; CpuAcc takes these layers so that they do not cut a chain of CpuAcc layers.
"""

from __future__ import annotations

from flowrt.engine.graph.layers.reshape import VIEW_SHAPES
from flowrt.registry import Support, WorkloadInfo
from flowrt.types import static_dims
from flowrt.workers.cpu.acc.kernels import acc_kernel


@acc_kernel(*VIEW_SHAPES)
class ViewKernel:
    """The input with the layer's output shape; ``outputs`` are never given (they own no bytes)."""

    @classmethod
    def supports(cls, info: WorkloadInfo) -> Support:
        if info.inputs[0] is None:
            return Support.no(f"CpuAcc {info.kind} takes a present data input only")
        return Support.yes()

    def __init__(self, info: WorkloadInfo, workers: int) -> None:
        self.info = info
        self.view_shape = VIEW_SHAPES[info.kind]
        # Static shapes in and out: the output shape is known now, and a run only reshapes.
        x, out = info.inputs[0], info.outputs[0] if info.outputs else None
        self.in_shape: tuple[int, ...] | None = None
        self.out_shape: tuple[int, ...] | None = None
        if x is not None and out is not None and x.is_static and out.is_static:
            self.in_shape, self.out_shape = static_dims(x.shape), static_dims(out.shape)

    def execute(self, inputs, outputs=None):
        # A non-contiguous input is copied by numpy's reshape; every other input is viewed.
        x = inputs[0]
        if self.out_shape is not None and x.shape == self.in_shape:
            return [x.reshape(self.out_shape)]
        return [x.reshape(self.view_shape(self.info.descriptor, x.shape, *inputs[1:]))]
