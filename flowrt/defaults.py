"""The default backend list, one for every entry point: ``flowrt.optimize``,
``InferenceSession`` with no providers, the onnx backend and the command line; and a
``backends`` argument read the same way by each of them (:func:`backend_ids`).

The default is the fastest list this machine has: CpuAcc then CpuRef (a layer CpuAcc lacks
falls back to the reference), with GpuAcc first only where OpenCL shows a real GPU. A CPU
OpenCL device (PoCL) does not count: it runs most models slower than CpuAcc, so it is used
only when named.

Importing this module costs nothing: OpenCL (pyopencl) is probed on the first call of
:func:`gpu_device_present`, once per process.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

from flowrt.validate import argument_error

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


def backend_ids(backends: Any, where: str) -> list[str]:
    """A ``backends`` argument as a list of backend ids: a sequence of ids, or one id as a
    string ("CpuAcc" is ``["CpuAcc"]``; never split, so "CpuAcc,CpuRef" is one unknown id).
    ArgumentError naming ``where`` otherwise."""
    if isinstance(backends, str):
        return [backends]
    expected = 'a backend id or a list of them (e.g. ["CpuAcc", "CpuRef"])'
    if not isinstance(backends, Sequence) or isinstance(backends, bytes):
        raise argument_error("backends", expected, backends, where=where)
    if not all(isinstance(bid, str) for bid in backends):
        raise argument_error("backends", expected, backends, where=where)
    return list(backends)
