"""The files of the cache of optimized networks (``flowrt.network_cache``): each entry, a
.flowrt file written once and never changed, and beside it the folder of the transformed
weights its constants were given by backends in later loads (``flowrt.engine.memory.weights``
reads them back mapped); writing an entry, removing one with its folder, and the least
recently used going past :data:`MAX_BYTES` in all (``FLOWRT_NETWORK_CACHE_BYTES``).
"""

from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path
from typing import TYPE_CHECKING

from flowrt import serialize
from flowrt.errors import FlowrtError

if TYPE_CHECKING:
    from flowrt.engine.graph.optimizer import OptimizedNetwork

logger = logging.getLogger("flowrt.network_cache")

BYTES_ENV = "FLOWRT_NETWORK_CACHE_BYTES"
MAX_BYTES = 4 << 30


def max_bytes() -> int:
    try:
        return int(os.environ.get(BYTES_ENV, MAX_BYTES))
    except ValueError:
        return MAX_BYTES


def forms_folder(entry: Path) -> Path:
    """The folder beside ``entry`` of the transformed weights of its constants that backends
    made (``flowrt.engine.memory.weights``: the entry's file never changes, so they last)."""
    return entry.with_suffix(".forms")


def remove(entry: Path) -> None:
    """Remove ``entry`` and the transformed weights kept beside it."""
    shutil.rmtree(forms_folder(entry), ignore_errors=True)
    entry.unlink(missing_ok=True)


def touch(entry: Path) -> None:
    try:
        os.utime(entry)  # the least recently used go first
    except OSError:
        pass


def store(optimized: OptimizedNetwork, entry: Path, prefix: str) -> bool:
    """Write ``entry``, removing the files of its folder not named with ``prefix`` first (the
    entries of the source path's former files); whether it was written."""
    try:
        for stale in entry.parent.iterdir():
            if not stale.name.startswith(prefix):
                if stale.is_dir():
                    shutil.rmtree(stale, ignore_errors=True)
                else:
                    stale.unlink(missing_ok=True)
        # the file is written anew: what was made of a former one's constants goes
        shutil.rmtree(forms_folder(entry), ignore_errors=True)
        serialize.save(optimized, entry)
    except (FlowrtError, OSError) as e:
        logger.info("the optimized network is not cached (%s): %s", entry, e)
        return False
    logger.info("optimized network cached: %s", entry)
    return True


def evict(root: Path, limit: int) -> None:
    """Remove the least recently used entries under ``root`` (with their transformed
    weights) while they hold more than ``limit`` bytes."""
    files = []
    for path in root.glob("*/*.flowrt"):
        try:
            info = path.stat()
            size, mtime = info.st_size, info.st_mtime
            forms = forms_folder(path)
            if forms.is_dir():
                size += sum(f.stat().st_size for f in forms.iterdir())
        except OSError:
            continue
        files.append((mtime, size, path))
    total = sum(size for _, size, _ in files)
    for _, size, path in sorted(files, key=lambda f: f[0]):
        if total <= limit:
            break
        remove(path)
        total -= size
