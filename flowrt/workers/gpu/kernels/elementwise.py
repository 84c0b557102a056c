"""Add, Sub, Mul, Div, Pow and Sum with numpy broadcasting (and the pre-opset-7 legacy rule), and
ApplyRotary."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from flowrt.engine.graph.layers.elementwise import legacy_b_shape
from flowrt.registry import Support, WorkloadInfo
from flowrt.types import static_dims
from flowrt.workers.gpu.device import cl
from flowrt.workers.gpu.kernels import (
    RANK,
    GpuKernel,
    activation_args,
    contiguous_strides,
    gpu_kernel,
    static_shape,
)
from flowrt.workers.gpu.launches import refuse
from flowrt.workers.gpu.tensor import GpuTensor

OPS = {"Add": 0, "Sub": 1, "Mul": 2, "Div": 3, "Pow": 4, "Sum": 0}


def broadcast_strides(shape: Sequence[int], out: Sequence[int], rank: int = RANK) -> list[int]:
    """Element strides of a C-contiguous ``shape`` read at the positions of ``out`` (rank
    ``rank``, leading dims padded): 0 along every dim that broadcasts."""
    padded = [1] * (rank - len(shape)) + list(shape)
    return [
        0 if size == 1 else stride for size, stride in zip(padded, contiguous_strides(padded), strict=True)
    ]


def stride_table(context: Any, out: Sequence[int], *stride_sets: Sequence[int]) -> Any:
    """A read-only device buffer holding strided_offset()'s table: ``out`` padded to rank
    ``RANK``, then each set of strides."""
    dims = [1] * (RANK - len(out)) + list(out)
    table = np.array([*dims, *(s for strides in stride_sets for s in strides)], np.int32)
    flags = cl.mem_flags.READ_ONLY | cl.mem_flags.COPY_HOST_PTR
    return cl.Buffer(context.context, flags, hostbuf=table)


@gpu_kernel("Add", "Sub", "Mul", "Div", "Pow", "Sum")
class BinaryKernel(GpuKernel):
    """y = act(a op b), broadcasting; Sum folds its inputs pairwise, left to right."""

    fuses_activation = True
    half_storage = True

    def prepare(self) -> None:
        self.kernel = self.context.kernel("elementwise", "binary", self.storage)
        shapes = [static_shape(i) for i in self.info.inputs]
        if getattr(self.info.descriptor, "legacy", False):
            shapes[1] = static_dims(legacy_b_shape(shapes[0], shapes[1], self.info.descriptor))
        self.op = np.int32(OPS[self.info.kind])
        # One stride table per step of the fold: the running result has the broadcast shape so far.
        self.steps = []
        current = shapes[0]
        for shape in shapes[1:]:
            out = np.broadcast_shapes(current, shape)
            table = stride_table(
                self.context, out, broadcast_strides(current, out), broadcast_strides(shape, out)
            )
            self.steps.append((out, table))
            current = out

    def enqueue(self, queue: Any, inputs: Sequence[GpuTensor], outputs: Sequence[GpuTensor]) -> Any:
        if len(inputs) == 1:  # Sum of one input
            y = outputs[0]
            refuse("a copy")
            x = inputs[0]
            return cl.enqueue_copy(
                queue, y.buffer, x.buffer, byte_count=y.nbytes, src_offset=x.offset, dst_offset=y.offset
            )
        result, event = inputs[0], None
        for i, (out, table) in enumerate(self.steps):
            last = i == len(self.steps) - 1
            # The fold's running results before the last are scratch, in two alternating slots
            # (a step reads the previous one's result and writes the other).
            y = outputs[0] if last else self.context.scratch(out, slot=i % 2, dtype=outputs[0].dtype)
            act = activation_args(self.info.activation if last else None)
            event = self.launch(self.kernel, queue, y.size,
                *result.kernel_args, *inputs[i + 1].kernel_args, *y.kernel_args, table, np.int32(y.size), self.op, *act,
            )  # fmt: skip
            result = y
        return event


@gpu_kernel("ApplyRotary")
class ApplyRotaryKernel(GpuKernel):
    """y = x * cos + rotate_half(x) * sin: one launch for the six of an exported rotary
    embedding, cos and sin read through their broadcast strides."""

    half_storage = True

    @classmethod
    def supports(cls, info: WorkloadInfo) -> Support:
        rank, perm = len(static_shape(info.inputs[0])), info.descriptor.perm
        if rank > RANK:
            return Support.no(f"GpuAcc applies rotary embeddings to tensors of rank {RANK} or less")
        if perm is not None and perm[-1] != rank - 1:
            return Support.no(
                f"GpuAcc's ApplyRotary reads X transposed with its last axis last; got perm {perm}"
            )
        return Support.yes()

    def prepare(self) -> None:
        self.kernel = self.context.kernel("elementwise", "apply_rotary", self.storage)
        x, perm = static_shape(self.info.inputs[0]), self.info.descriptor.perm
        strides = contiguous_strides(x)
        out = tuple(x[p] for p in perm) if perm is not None else x
        read = [strides[p] for p in perm] if perm is not None else strides
        cos, sin = (static_shape(i) for i in self.info.inputs[1:3])
        padded = [0] * (RANK - len(out)) + read
        self.table = stride_table(
            self.context, out, broadcast_strides(cos, out), broadcast_strides(sin, out), padded
        )
        self.length = np.int32(out[-1])

    def enqueue(self, queue: Any, inputs: Sequence[GpuTensor], outputs: Sequence[GpuTensor]) -> Any:
        x, cos, sin = inputs
        y = outputs[0]
        return self.launch(self.kernel, queue, y.size, *x.kernel_args, *cos.kernel_args, *sin.kernel_args,
            *y.kernel_args, self.table, self.length, np.int32(y.size),
        )  # fmt: skip
