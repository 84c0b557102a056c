"""numpy's OpenBLAS on one thread while the CPU workers run CpuAcc's kernels.

CpuAcc's kernels split their windows across threads themselves and call numpy's OpenBLAS from
inside those slices (``flowrt.workers.cpu.acc.openblas``): each call must run on its calling
thread alone. OpenBLAS has no per-thread count: ``openblas_set_num_threads_local`` sets the
process's count and returns the one before. Setting it around each call from two slices at
once let one slice's GEMM run on OpenBLAS's own threads whenever the other had just set the
count back: those then spin for about 0.1 s after the call, on the cores the slices need.
On this project's 2-core machine ResNet-18 took 51 ms on two workers against 45 on one.

So the count is one while any job that calls CpuAcc's kernels runs: CpuAcc's workloads call
:func:`hold_for_job` (once per job, on a worker's thread), and the worker ends the hold when
the job ends (:func:`begin_job`, :func:`end_job`); the last release gives back the count the
first hold found. numpy's products (other threads of the user's, CpuRef's beside a CpuAcc
job) run on one thread while such a job is in flight, and on their own count otherwise: a
job of CpuRef alone keeps numpy's threads, and its results (a model whose channels differ
in the last bits of sums of 10^10 gives another softmax on one thread than on two). Where
numpy has no OpenBLAS with that function, nothing is done (CpuAcc then calls scipy's, which
``blas.pin_scipy_blas`` keeps to one thread).
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


_job = threading.local()  # per worker thread: ``active`` while a job runs, ``holding``


def begin_job() -> None:
    """A worker's job starts on this thread."""
    _job.active = True


def hold_for_job() -> None:
    """The job running on this thread calls CpuAcc's kernels: numpy's OpenBLAS on one thread
    until it ends. Outside a worker's job (a kernel called directly) nothing is held."""
    if getattr(_job, "active", False) and not getattr(_job, "holding", False):
        hold()
        _job.holding = True


def end_job() -> None:
    """The job on this thread ended: its hold, if it took one, is released."""
    _job.active = False
    if getattr(_job, "holding", False):
        _job.holding = False
        release()
