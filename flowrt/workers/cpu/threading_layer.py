"""Which threading layer runs CpuAcc's parallel regions: TBB where it is installed; and
libgomp's spinning, where numba falls back to OpenMP.

numba runs a kernel's ``prange`` loop on a threading layer. With OpenMP (libgomp) a region
ends at a barrier that waits for every thread of the team, so when another process holds a
core, each kernel waits for the OS to schedule the helper thread that is not running: on
this 2-core machine, beside one busy process, MobileNetV3-small's 108 layers went from
8 ms to 130 ms. TBB splits the same loop into tasks that whichever threads are running
take, the calling thread included, and waits only for the tasks: a helper that the OS does
not schedule just takes none (ONNX Runtime's thread pool works the same way).

The ``tbb`` package (a dependency on the platforms it has wheels for) installs ``libtbb``
into the environment's ``lib`` folder, which the dynamic loader does not search; numba
looks it up by name only. :func:`prepare` loads it from where the package's own file list
puts it, then asks numba for the ``tbb`` layer. Without TBB, or when the user chose a layer
(``NUMBA_THREADING_LAYER``), numba's choice stands.

Without TBB numba runs on OpenMP, whose helpers spin about 3 ms between regions unless
``GOMP_SPINCOUNT`` says otherwise: :func:`prepare` sets it (unless it is set already) to
about 0.3 ms, long enough to bridge the gaps between a run's kernels, short enough that idle
helpers soon leave the cores to other work. libgomp reads it once, when the process loads it:
when numba starts its OpenMP layer, unless another library of the process loaded it before.

Both are process-wide, so nothing here happens when flowrt is imported: :func:`prepare` runs
(once) before flowrt could first start numba's threading layer, in one of two places: where a
CPU worker pool is made (``CpuWorkerPool``, whose threads then set numba's thread count,
which starts the layer), and where CpuAcc's kernel package is imported
(``flowrt.workers.cpu.acc.kernels``: every kernel module, CpuAcc's layer support and its
workload factory import it before any kernel is compiled or run, and compiling or running a
``parallel=True`` function starts the layer too). numba itself is imported there, not
before. A layer the process started before (its own numba code) stays, as numba allows no
other.
"""

from __future__ import annotations

import ctypes
import importlib.metadata
import logging
import os
import sys
import threading

logger = logging.getLogger(__name__)

# What prepare() asked numba for; None before it ran.
_requested: str | None = None
_prepare_lock = threading.Lock()

# libgomp's spin before a helper thread sleeps, in its units (about 0.3 ms; see the module doc).
GOMP_SPINCOUNT = "30000"

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


def prepare() -> str:
    """Choose numba's threading layer and libgomp's spin before numba starts a layer (once per
    process; later calls return at once), importing numba. Returns what was asked for:
    ``"tbb"``, or numba's choice when TBB is missing or the user chose a layer (TBB's library
    is loaded all the same, so that a user's choice of it works too). Process-wide: see the
    module doc for who calls it and when."""
    global _requested
    if _requested is not None:
        return _requested
    with _prepare_lock:
        if _requested is None:
            _requested = _select()
    return _requested


def _select() -> str:
    # Read by libgomp when the process loads it (numba's OpenMP layer), after this.
    os.environ.setdefault("GOMP_SPINCOUNT", GOMP_SPINCOUNT)
    import numba

    path = _load_tbb()
    started = current()
    if started is not None:  # the process ran numba's parallel code before flowrt's first use
        logger.info("numba's %r threading layer was started before CpuAcc's first use: it stays", started)
        return started
    if os.environ.get("NUMBA_THREADING_LAYER"):
        return str(numba.config.THREADING_LAYER)  # type: ignore[attr-defined]  # numba.config sets its options at import
    if path is None:
        logger.info(
            "TBB is not installed: CpuAcc runs on numba's default threading layer, which "
            "slows down more when other processes share the cores (pip install tbb)"
        )
        return str(numba.config.THREADING_LAYER)  # type: ignore[attr-defined]  # numba.config sets its options at import
    numba.config.THREADING_LAYER = "tbb"  # type: ignore[attr-defined]  # numba.config sets its options at import
    logger.debug("CpuAcc's parallel regions run on TBB (%s)", path)
    return "tbb"


def requested() -> str:
    """The layer :func:`prepare` asked numba for (``"default"``: numba's own order);
    prepares it first where that has not happened yet."""
    return prepare()


def current() -> str | None:
    """The layer numba runs on, once it has started one; None before (and where numba was
    never imported)."""
    numba = sys.modules.get("numba")
    if numba is None:
        return None
    try:
        return str(numba.threading_layer())
    except ValueError:
        return None
