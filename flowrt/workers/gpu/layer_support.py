"""Which layers GpuAcc runs: float32 layers of static, non-empty shapes with a kernel that
takes their attributes, and float16 ones (stored as half, computed in float) where the kernel
takes them; none at all when the machine has no OpenCL device."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from flowrt.registry import Support, WorkloadInfo
from flowrt.types import DataType, TensorInfo
from flowrt.workers.gpu.device import unavailable_reason
from flowrt.workers.gpu.kernels import load_all


def _tensor_problem(info: TensorInfo, what: str, half: bool) -> str:
    if info.dtype is not DataType.FLOAT32 and not (half and info.dtype is DataType.FLOAT16):
        kinds = "float32 and float16 (stored as half)" if half else "float32"
        return f"GpuAcc runs {kinds} only; {what} is {info.dtype.value}"
    if info.shape is None or not info.is_static:
        return f"GpuAcc needs static shapes; {what} has shape {info.shape}"
    if info.num_elements == 0:
        return f"GpuAcc leaves empty tensors to the host; {what} has shape {info.shape}"
    if len(info.shape) > 6:
        return f"GpuAcc runs tensors of rank 6 or less; {what} has rank {len(info.shape)}"
    return ""


class GpuLayerSupport:
    """GpuAcc's answers; a layer it declines falls back to the next backend, with this reason."""

    def __init__(self) -> None:
        # Asked once per optimize (the backend makes one of these per call), not per layer.
        self.unavailable = unavailable_reason()

    def is_layer_supported(
        self,
        kind: str,
        descriptor: Any,
        inputs: Sequence[TensorInfo | None],
        outputs: Sequence[TensorInfo | None],
    ) -> Support:
        if self.unavailable:
            return Support.no(f"GpuAcc is unavailable: {self.unavailable}")
        kernel = load_all().get(kind)
        if kernel is None:
            return Support.no(f"no GpuAcc kernel for {kind}")
        device_inputs = [(f"input {i}", t) for i, t in enumerate(inputs) if i not in kernel.host_inputs]
        for what, info in [*device_inputs, *((f"output {i}", t) for i, t in enumerate(outputs))]:
            if info is None:
                continue
            problem = _tensor_problem(info, what, kernel.half_storage)
            if problem:
                return Support.no(problem)
        return kernel.supports(WorkloadInfo("", kind, descriptor, tuple(inputs), tuple(outputs)))  # type: ignore[arg-type]  # inferred outputs are never None
