"""The default backend list, one for every entry point: ``flowrt.optimize``,
``InferenceSession`` with no providers, the onnx backend and the command line.

The default is the fastest list this machine has: CpuAcc then CpuRef (a layer CpuAcc lacks
falls back to the reference), with GpuAcc first only where OpenCL shows a real GPU. A CPU
OpenCL device (PoCL) does not count: it runs most models slower than CpuAcc, so it is used
only when named.

Importing this module costs nothing: OpenCL (pyopencl) is probed on the first call of
:func:`gpu_device_present`, once per process.
"""

from __future__ import annotations

import functools

GPU_BACKEND = "GpuAcc"
CPU_BACKENDS = ("CpuAcc", "CpuRef")


@functools.cache
def gpu_device_present() -> bool:
    """Whether OpenCL shows a GPU device (a CPU device does not count). Imports pyopencl on the
    first call only; the answer is kept for the life of the process."""
    from flowrt.workers.gpu.device import gpu_device_present as probe

    return probe()


def default_backends() -> list[str]:
    """The fastest backends available: ``["GpuAcc", "CpuAcc", "CpuRef"]`` where OpenCL shows a
    GPU, else ``["CpuAcc", "CpuRef"]``. A new list each call: the caller may change it."""
    return [GPU_BACKEND, *CPU_BACKENDS] if gpu_device_present() else list(CPU_BACKENDS)
