"""GpuAcc's place in the default backend list, importable without OpenCL: ``import flowrt``
registers it, and OpenCL (pyopencl) is probed when a default list is first built."""

from __future__ import annotations

from flowrt.registry import DefaultRank


def runs_by_default() -> bool:
    """Whether OpenCL shows a real GPU. A CPU OpenCL device (PoCL's) does not count: it runs
    most models slower than CpuAcc, so GpuAcc runs on it only when named. The first call
    imports pyopencl; the answer is kept for the process (``device.gpu_device_present``)."""
    from flowrt.workers.gpu import device

    return device.gpu_device_present()


# First in the default list, where it runs at all.
DEFAULT_RANK = DefaultRank(10, runs_here=runs_by_default)
