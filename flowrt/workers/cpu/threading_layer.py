"""Which threading layer runs CpuAcc's parallel regions: TBB where it is installed.

numba runs a kernel's ``prange`` loop on a threading layer. With OpenMP (libgomp) a region
ends at a barrier that waits for every thread of the team, so when another process holds a
core, each kernel waits for the OS to schedule the helper thread that is not running: on
this 2-core machine, beside one busy process, MobileNetV3-small's 108 layers went from
8 ms to 130 ms. TBB splits the same loop into tasks that whichever threads are running
take, the calling thread included, and waits only for the tasks: a helper that the OS does
not schedule just takes none (ONNX Runtime's thread pool works the same way).

The ``tbb`` package (a dependency on the platforms it has wheels for) installs ``libtbb``
into the environment's ``lib`` folder, which the dynamic loader does not search; numba
looks it up by name only. :func:`select` loads it from where the package's own file list
puts it, then asks numba for the ``tbb`` layer. It must run before numba starts any
parallel region, so :mod:`flowrt.workers.cpu.workers` calls it on import. Without TBB,
or when the user chose a layer (``NUMBA_THREADING_LAYER``), numba's choice stands.
"""

from __future__ import annotations

import ctypes
import importlib.metadata
import logging
import os
import sys

import numba

logger = logging.getLogger(__name__)

# What select() asked numba for.
_requested: str | None = None

_LIBRARY = {"linux": "libtbb.so.12", "darwin": "libtbb.12.dylib", "win32": "tbb12.dll"}


def _load_tbb() -> str | None:
    """The path of the ``tbb`` package's library, loaded for the whole process; None where
    the package or its library is missing."""
    name = _LIBRARY.get(sys.platform)
    if name is None:
        return None
    try:
        files = importlib.metadata.files("tbb") or []
    except importlib.metadata.PackageNotFoundError:
        return None
    for file in files:
        if file.name == name:
            path = str(file.locate())
            try:
                # Global, so that numba's tbbpool extension finds it by name.
                ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
            except OSError as e:
                logger.info("TBB found at %s but not loadable: %s", path, e)
                return None
            return path
    return None


def select() -> str:
    """Choose the threading layer before numba starts one (idempotent); returns what was
    asked for: ``"tbb"``, or numba's choice when TBB is missing or the user chose a layer
    (TBB's library is loaded all the same, so that a user's choice of it works too)."""
    global _requested
    path = _load_tbb()
    if os.environ.get("NUMBA_THREADING_LAYER"):
        _requested = str(numba.config.THREADING_LAYER)
    elif path is None:
        logger.info(
            "TBB is not installed: CpuAcc runs on numba's default threading layer, which "
            "slows down more when other processes share the cores (pip install tbb)"
        )
        _requested = str(numba.config.THREADING_LAYER)
    else:
        numba.config.THREADING_LAYER = "tbb"
        logger.debug("CpuAcc's parallel regions run on TBB (%s)", path)
        _requested = "tbb"
    return _requested


def requested() -> str:
    """The layer :func:`select` asked numba for (``"default"``: numba's own order)."""
    return select() if _requested is None else _requested


def current() -> str | None:
    """The layer numba runs on, once it has started one; None before."""
    try:
        return str(numba.threading_layer())
    except ValueError:
        return None
