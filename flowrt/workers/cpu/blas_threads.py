"""numpy's OpenBLAS on one thread while the CPU workers run jobs.

CpuAcc's kernels split their windows across threads themselves and call numpy's OpenBLAS from
inside those slices (``flowrt.workers.cpu.acc.openblas``): each call must run on its calling
thread alone. OpenBLAS has no per-thread count: ``openblas_set_num_threads_local`` sets the
process's count and returns the one before. Setting it around each call from two slices at
once let one slice's GEMM run on OpenBLAS's own threads whenever the other had just set the
count back: those then spin for about 0.1 s after the call, on the cores the slices need.
On this project's 2-core machine ResNet-18 took 51 ms on two workers against 45 on one.

So the pool sets the count to one while any of its jobs runs: :func:`hold` when a job starts,
:func:`release` when it ends; the last release gives back the count the first hold found.
numpy's products (CpuRef's, other threads of the user's) run on one thread while a job is in
flight, and on their own count between runs. Where numpy has no OpenBLAS with that function,
nothing is done (CpuAcc then calls scipy's, which ``blas.pin_scipy_blas`` keeps to one thread).
"""

from __future__ import annotations

import ctypes
import logging
import threading
from collections.abc import Callable

logger = logging.getLogger(__name__)

_lock = threading.Lock()
_holders = 0
_before = 0  # the count the first hold found
_set_count: Callable[[int], int] | None = None
_bound = False


def _bind() -> Callable[[int], int] | None:
    """numpy's ``openblas_set_num_threads_local`` (returning the count before), or None."""
    import threadpoolctl  # a few ms, on the first job of the process

    for info in threadpoolctl.threadpool_info():
        if info.get("internal_api") != "openblas" or "openblas64_" not in info.get("filepath", ""):
            continue
        try:
            function = ctypes.CDLL(info["filepath"]).openblas_set_num_threads_local
        except (OSError, AttributeError) as e:
            logger.info("numpy's OpenBLAS at %s sets no thread count: %s", info["filepath"], e)
            return None
        function.restype, function.argtypes = ctypes.c_int, [ctypes.c_int]
        return function
    return None


def hold() -> None:
    """One more job runs: numpy's OpenBLAS on one thread from now until the last release."""
    global _holders, _before, _set_count, _bound
    with _lock:
        if not _bound:
            _set_count, _bound = _bind(), True
        if _holders == 0 and _set_count is not None:
            _before = _set_count(1)
        _holders += 1


def release() -> None:
    """A job ended: the last one gives numpy's OpenBLAS back the count the first hold found."""
    global _holders
    with _lock:
        _holders -= 1
        if _holders == 0 and _set_count is not None:
            _set_count(_before)


def holders() -> int:
    """Jobs holding numpy's OpenBLAS to one thread now."""
    return _holders
