"""glibc's malloc kept from giving back, and faulting in again, the scratch of every run.

CpuAcc's kernels take their scratch (Winograd's transformed tiles, im2col columns, packed
panels) from malloc inside their jitted code, a few hundred KiB to a few MiB per call, freed
when the call ends. glibc serves a block that large by ``mmap`` and returns it by
``munmap`` (its threshold adapts upwards only for the main thread's arena, and a worker
thread's arena gives back the free top of its heap once it passes 128 KiB): every run then
touches fresh pages again. On a 2-core AMD EPYC VM, ResNet-50 took 3,660 page faults a run,
11-16 ms of system time in a 37-41 ms run on two workers; with the thresholds below, 0
faults, 1.3-1.8 ms of system time, 29-31 ms a run.

So the first CPU worker pool of a process raises both thresholds (``mallopt``): blocks up to
``MMAP_THRESHOLD`` come from the arenas, and an arena keeps up to ``TRIM_THRESHOLD`` of free
memory at its top. The peak RSS of a process that loads a model and runs it is unchanged
(inception_v2 261 MiB either way: a run's scratch is live at its peak anyway); a process
may keep its largest run's scratch after its runs. ONNX Runtime keeps its own arena of
scratch the same way.

Nothing is changed where the C library is not glibc, where the environment already sets
either threshold (``MALLOC_MMAP_THRESHOLD_``, ``MALLOC_TRIM_THRESHOLD_``, or either in
``GLIBC_TUNABLES``), or where ``FLOWRT_MALLOC_TUNING=0``.
"""

from __future__ import annotations

import ctypes
import logging
import os
import platform
import threading

logger = logging.getLogger(__name__)

ENV = "FLOWRT_MALLOC_TUNING"
# mallopt's parameters (malloc.h)
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
MMAP_THRESHOLD = 32 << 20  # glibc's own dynamic threshold stops there
TRIM_THRESHOLD = 64 << 20

_lock = threading.Lock()
_tuned = False  # whether tune() has been called in this process (applied or not)
_applied = False


def _set_by_environment() -> bool:
    """Whether the user set either threshold in the environment (then it is theirs)."""
    if any(os.environ.get(name) for name in ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_")):
        return True
    tunables = os.environ.get("GLIBC_TUNABLES", "")
    return "mmap_threshold" in tunables or "trim_threshold" in tunables


def tune() -> bool:
    """Raise glibc's mmap and trim thresholds once per process (see the module docstring);
    whether this process's malloc runs with them (False where nothing was changed)."""
    global _tuned, _applied
    with _lock:
        if _tuned:
            return _applied
        _tuned = True
        if os.environ.get(ENV, "1").strip() == "0":
            logger.info("%s=0: glibc's malloc thresholds left as they are", ENV)
            return False
        if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc" or _set_by_environment():
            return False
        try:
            mallopt = ctypes.CDLL(None).mallopt
        except (OSError, AttributeError):  # pragma: no cover - glibc always has it
            return False
        mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
        _applied = bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(
            mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD)
        )
        logger.info(
            "glibc malloc: mmap threshold %d MiB, trim threshold %d MiB (%s)",
            MMAP_THRESHOLD >> 20,
            TRIM_THRESHOLD >> 20,
            "set" if _applied else "refused",
        )
        return _applied
