"""Pad in every mode (constant, reflect, edge, wrap), negative pads (crops) too."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from flowrt.engine.graph.layers.pad import PAD_MODES, pad_widths
from flowrt.engine.graph.layers.reshape import const_ints
from flowrt.errors import BackendError
from flowrt.workers.gpu.device import cl
from flowrt.workers.gpu.kernels import RANK, GpuKernel, gpu_kernel, static_shape
from flowrt.workers.gpu.kernels.elementwise import broadcast_strides
from flowrt.workers.gpu.tensor import GpuTensor


def pad_table(shape: Sequence[int], widths: Sequence[tuple[int, int]]) -> np.ndarray:
    """pad.cl's table: per dim the output size, input stride, first kept index, values grown
    before the kept range and its length; leading dims padded to rank ``RANK``."""
    lead = RANK - len(shape)
    strides = broadcast_strides(shape, shape)
    out, lo, grown, kept = [1] * RANK, [0] * RANK, [0] * RANK, [1] * RANK
    for d, (size, (begin, end)) in enumerate(zip(shape, widths, strict=True)):
        out[lead + d] = size + begin + end
        lo[lead + d] = max(-begin, 0)
        grown[lead + d] = max(begin, 0)
        kept[lead + d] = size - max(-begin, 0) - max(-end, 0)
    return np.array([*out, *strides, *lo, *grown, *kept], np.int32)


@gpu_kernel("Pad")
class PadKernel(GpuKernel):
    """Pad with constant pads (attribute, or a constant input) and axes."""

    host_inputs = frozenset({1, 2, 3})

    def prepare(self) -> None:
        self.kernel = self.context.kernel("pad", "pad")
        desc = self.info.descriptor
        shape = static_shape(self.info.inputs[0])
        pads = desc.pads_attribute if desc.pads_attribute is not None else const_ints(self.constant(1))
        has_axes = len(self.info.inputs) > 3 and self.info.inputs[3] is not None
        axes = const_ints(self.constant(3)) if has_axes else None
        if pads is None or (has_axes and axes is None):
            raise BackendError(
                f"GpuAcc Pad {self.info.layer_name!r} expects constant pads and axes, found "
                "inputs computed at run time"
            )
        table = pad_table(shape, pad_widths(len(shape), list(pads), axes))
        flags = cl.mem_flags.READ_ONLY | cl.mem_flags.COPY_HOST_PTR
        self.table = cl.Buffer(self.context.context, flags, hostbuf=table)
        self.mode = np.int32(PAD_MODES.index(desc.mode))

    def value(self, constant_value: Any) -> np.float32:
        """The constant: the attribute (old opsets), else the input's first value, else 0."""
        desc = self.info.descriptor
        if desc.pads_attribute is not None:
            return np.float32(desc.value)
        if constant_value is None or np.asarray(constant_value).size == 0:
            return np.float32(0)
        return np.float32(np.asarray(constant_value).reshape(-1)[0])

    def enqueue(self, queue: Any, inputs: Sequence[Any], outputs: Sequence[GpuTensor]) -> Any:
        x, y = inputs[0], outputs[0]
        value = self.value(inputs[2] if len(inputs) > 2 else None)
        return self.launch(
            self.kernel,
            queue,
            y.size,
            *x.kernel_args,
            *y.kernel_args,
            self.table,
            np.int32(y.size),
            self.mode,
            value,
        )
