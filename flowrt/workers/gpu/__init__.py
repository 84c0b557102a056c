"""GpuAcc: the OpenCL backend (importable, and declining every layer, without OpenCL).

pyopencl is imported with the backend, on first use: ``import flowrt`` and a CPU-only
process never load it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from flowrt.workers.gpu.backend import GpuAccBackend
    from flowrt.workers.gpu.tensor import GpuTensor

__all__ = ["GpuAccBackend", "GpuTensor"]


def __getattr__(name: str) -> Any:
    if name == "GpuAccBackend":
        from flowrt.workers.gpu.backend import GpuAccBackend

        return GpuAccBackend
    if name == "GpuTensor":
        from flowrt.workers.gpu.tensor import GpuTensor

        return GpuTensor
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
