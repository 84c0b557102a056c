"""A digest of a package's sources, for caches whose entries are only as good as the code
that made them (numba's kernels of CpuAcc, the cache of optimized networks)."""

from __future__ import annotations

import functools
import hashlib
import os


def sources_digest(root: str | os.PathLike[str]) -> str:
    """A digest of the path (relative to ``root``), size and modification time of every
    ``.py`` file under ``root``: one ``os.walk``, about 5 ms for flowrt's 360 files."""
    top = os.fspath(root)
    files = []
    for folder, subfolders, names in os.walk(top):
        subfolders[:] = [d for d in subfolders if d != "__pycache__"]
        for name in names:
            if name.endswith(".py"):
                path = os.path.join(folder, name)
                stat = os.stat(path)
                files.append(f"{os.path.relpath(path, top)}:{stat.st_size}:{stat.st_mtime_ns};")
    return hashlib.sha1("".join(sorted(files)).encode()).hexdigest()


@functools.cache
def flowrt_digest() -> str:
    """:func:`sources_digest` of flowrt itself, once per process: what a cache of what flowrt
    made or measured (optimized networks, performance hints' costs) is only as good as."""
    return sources_digest(os.path.dirname(os.path.realpath(__file__)))
