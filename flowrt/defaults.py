"""The default backend list, one for every entry point: ``flowrt.optimize``,
``InferenceSession`` with no providers, the onnx backend and the command line; and a
``backends`` argument read the same way by each of them (:func:`backend_ids`).

The default is the fastest list this machine has: CpuAcc then CpuRef (a layer CpuAcc lacks
falls back to the reference), with GpuAcc first only where OpenCL shows a real GPU. A CPU
OpenCL device (PoCL) does not count: it runs most models slower than CpuAcc, so it is used
only when named.

The list is built from the process registry: each backend is registered with its place in
it (``flowrt.registry.DefaultRank``) and answers whether it runs here, so this module names
no backend module. Importing it costs nothing: GpuAcc's answer probes OpenCL (imports
pyopencl) when a default list is first built, once per process.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from flowrt.registry import backend_registry
from flowrt.validate import argument_error

CACHE_ENV = "FLOWRT_CACHE_DIR"
GPU_BACKEND = "GpuAcc"
CPU_BACKENDS = ("CpuAcc", "CpuRef")


def default_cpu_workers() -> int:
    """The number of cores this process may use."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not every platform has affinity
        return os.cpu_count() or 1


def cache_root() -> Path:
    """Where flowrt keeps what it made once for later processes (GpuAcc's program binaries,
    the performance hints' measurements): ``FLOWRT_CACHE_DIR``, else ``~/.cache/flowrt``."""
    return Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "flowrt")


def gpu_device_present() -> bool:
    """Whether GpuAcc runs by default here: OpenCL shows a GPU device (a CPU device does not
    count). The first call imports pyopencl; the answer is kept for the life of the process."""
    return backend_registry().runs_by_default(GPU_BACKEND)


def default_backends() -> list[str]:
    """The fastest backends available, from the process registry's default ranks:
    ``["GpuAcc", "CpuAcc", "CpuRef"]`` where OpenCL shows a GPU, else ``["CpuAcc", "CpuRef"]``
    (and any backend registered with a DefaultRank in its place). A new list each call: the
    caller may change it."""
    return [str(bid) for bid in backend_registry().default_ids()]


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
