"""numba's disk cache of CpuAcc's kernels, stale as soon as any of their sources changes.

numba keys each cached function by the stamp (modification time and size) of its own source
file only. A kernel's cached code holds the code of every jitted function it calls, and the
names of the symbols it links to, from other files: after an update that changes a callee's
file but not the caller's, the caller's stale code was loaded, and where a symbol it names
was gone the process aborted in LLVM ("Symbol not found"). An install by pip rewrites every
file, which renews every stamp; a checkout or an editable install does not.

:func:`register` puts a locator in front of numba's own for the files of this package: the
same places on disk as numba's (beside the sources, or under ``NUMBA_CACHE_DIR``), with a
stamp that adds the stamps of every source file of the package. A change to any of them
makes numba compile each kernel again, once, and overwrite its entry. It also installs
``cache_claims``: several processes may compile into one cache at once.
"""

from __future__ import annotations

import functools
import os
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

from numba.core import caching
from numba.core.runtime import rtsys

from flowrt import source_stamps
from flowrt.workers.cpu.acc import cache_claims

if TYPE_CHECKING:  # the names of the numba this is checked against
    from numba.core.caching import CacheImpl as _IMPL
    from numba.core.caching import InTreeCacheLocator as _IN_TREE
    from numba.core.caching import UserProvidedCacheLocator as _USER_DIR
else:  # numba 0.59-0.6x names these with a leading underscore
    _IMPL = getattr(caching, "CacheImpl", None) or caching._CacheImpl
    _USER_DIR = getattr(caching, "UserProvidedCacheLocator", None) or caching._UserProvidedCacheLocator
    _IN_TREE = getattr(caching, "InTreeCacheLocator", None) or caching._InTreeCacheLocator

ROOT = Path(__file__).resolve().parent  # flowrt/workers/cpu/acc: every jitted function


def sources_digest() -> str:
    """A digest of the path, size and modification time of every source file under ROOT."""
    return source_stamps.sources_digest(ROOT)


def stamp() -> str:
    """The digest this process stamps its cache entries with: :func:`sources_digest` as it
    was when first asked (walking the package's files costs ~10 ms), and ``FLOWRT_TILES``,
    whose tile shape the kernels are compiled with (``tile_ir.py``): a cache filled under one
    value served another's panels to code of another shape (NaNs)."""
    if _PackageStamp._digest is None:
        _PackageStamp._digest = f"{sources_digest()}-tiles={os.environ.get('FLOWRT_TILES', '')}"
    return _PackageStamp._digest


@functools.cache
def _in_package(py_file: str) -> bool:
    """Whether ``py_file`` lies under ROOT (resolving a path costs ~70 us; a module jits many
    functions)."""
    return Path(py_file).resolve().is_relative_to(ROOT)


_WRITABLE: set[str] = set()  # cache directories found writable by this process


class _PackageStamp:
    """Mixin: take only this package's functions, and stamp them with the package's sources."""

    _digest: str | None = None

    @classmethod
    def from_function(cls, py_func, py_file):
        if not _in_package(py_file):
            return None
        return super().from_function(py_func, py_file)

    def get_source_stamp(self):
        return (super().get_source_stamp(), stamp())

    def ensure_cache_path(self):
        """numba's check: the directory exists (made again if it went) and takes a new
        file, the latter once per directory and process: numba checks at each function's jit
        (~200 of the package's at import, each a temporary file made and removed)."""
        path = self.get_cache_path()
        os.makedirs(path, exist_ok=True)
        if path not in _WRITABLE:
            tempfile.TemporaryFile(dir=path).close()
            _WRITABLE.add(path)


class _UserDirLocator(_PackageStamp, _USER_DIR):
    """Under ``NUMBA_CACHE_DIR``, where it is set."""


class _InTreeLocator(_PackageStamp, _IN_TREE):
    """Beside the sources, in ``__pycache__``."""


def register() -> None:
    """Put the package's locators in front of numba's (once per process), before any of its
    functions is jitted: the modules that jit first call it (``calls``, ``openblas``, the
    kernels' package). ``NUMBA_CACHE_LOCATOR_CLASSES`` in the environment overrides them all."""
    classes = _IMPL._locator_classes
    if _UserDirLocator in classes:
        return
    classes[:0] = [_UserDirLocator, _InTreeLocator]
    _load_without_refresh()
    cache_claims.install(is_ours)


def _load_without_refresh() -> None:
    """numba's ``Cache.load_overload`` refreshes the target context before it looks in the
    cache: the first refresh imports and installs all of numba's implementations (its numpy,
    unicode, random, hashing, BLAS through scipy...), 0.3-0.4 s, which only compiling needs.
    For this package's functions a load initializes numba's runtime alone (the symbols that
    cached code links to), and the refresh is left to a compile, whose compiler refreshes the
    contexts itself: a process whose kernels are all cached never pays it."""
    load = caching.Cache.load_overload

    def load_overload(self: Any, sig: Any, target_context: Any) -> Any:
        if not is_ours(self):
            return load(self, sig, target_context)
        rtsys.initialize(target_context)
        with self._guard_against_spurious_io_errors():
            return self._load_overload(sig, target_context)
        return None  # numba's guard swallowed a spurious error (Windows): a miss

    caching.Cache.load_overload = load_overload  # type: ignore[method-assign]


def is_ours(cache: Any) -> bool:
    """Whether numba's ``cache`` is one of this package's functions' (located here)."""
    return isinstance(getattr(cache, "_impl", None) and cache._impl.locator, _PackageStamp)
