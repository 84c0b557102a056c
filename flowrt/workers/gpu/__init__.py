"""GpuAcc: the OpenCL backend (importable, and declining every layer, without OpenCL)."""

from flowrt.workers.gpu.backend import GpuAccBackend
from flowrt.workers.gpu.tensor import GpuTensor

__all__ = ["GpuAccBackend", "GpuTensor"]
