"""Cast between float32 and float16: the borders of the layers ``reduce_fp32_to_fp16`` runs
in half precision on GpuAcc (elementwise.cl's ``to_half`` and ``from_half``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from flowrt.registry import Support, WorkloadInfo
from flowrt.types import DataType
from flowrt.workers.gpu.kernels import GpuKernel, gpu_kernel
from flowrt.workers.gpu.tensor import GpuTensor

_FLOATS = {DataType.FLOAT32, DataType.FLOAT16}


@gpu_kernel("Cast")
class CastKernel(GpuKernel):
    """float32 to float16 (rounded to nearest even, as numpy rounds) and back."""

    half_storage = True

    @classmethod
    def supports(cls, info: WorkloadInfo) -> Support:
        source_info, target_info = info.inputs[0], info.outputs[0]
        if source_info is None or target_info is None:
            return Support.no("GpuAcc casts tensors of known types only")
        source, target = source_info.dtype, target_info.dtype
        if {source, target} != _FLOATS:
            return Support.no(
                f"GpuAcc casts between float32 and float16 only; got {source.value} to {target.value}"
            )
        return Support.yes()

    def prepare(self) -> None:
        to_half = self.info.outputs[0].dtype is DataType.FLOAT16
        self.kernel = self.context.kernel("elementwise", "to_half" if to_half else "from_half")

    def enqueue(self, queue: Any, inputs: Sequence[GpuTensor], outputs: Sequence[GpuTensor]) -> Any:
        x, y = inputs[0], outputs[0]
        return self.launch(self.kernel, queue, y.size, *x.kernel_args, *y.kernel_args, np.int32(y.size))
