"""A whole file as one read-only buffer: mapped into memory (its pages read when first
touched and shared with every process mapping it) or read once into 64-byte-aligned host
memory. ``flowrt.serialize`` loads .flowrt files through it."""

from __future__ import annotations

import mmap as mmap_module
import os
import stat

import numpy as np

from flowrt.errors import ModelLoadError

ALIGNMENT = 64


def read_whole(where: str, mapped: bool) -> np.ndarray:
    """The whole file in one read-only uint8 buffer whose first byte is 64-byte aligned."""
    try:
        info = os.stat(where)
        if not stat.S_ISREG(info.st_mode):
            raise ModelLoadError(f"model path {where} is not a regular file")
        with open(where, "rb", buffering=0) as f:
            if mapped and info.st_size:
                return np.frombuffer(
                    mmap_module.mmap(f.fileno(), 0, access=mmap_module.ACCESS_READ), np.uint8
                )
            buffer = host_buffer(info.st_size)
            filled = 0
            with buffer.data as view:
                while filled < len(buffer):
                    count = f.readinto(view[filled:])
                    if not count:
                        break
                    filled += count
    except FileNotFoundError:
        raise ModelLoadError(f"model file {where} does not exist") from None
    except (OSError, ValueError, MemoryError) as e:
        raise ModelLoadError(f"model file {where}: cannot read it: {type(e).__name__}: {e}") from e
    buffer = buffer[:filled]
    buffer.flags.writeable = False
    return buffer


def host_buffer(size: int) -> np.ndarray:
    """``size`` writable bytes, 64-byte aligned, their pages mapped up front where the OS can
    (one MAP_POPULATE call costs a fraction of faulting a large buffer in page by page)."""
    populate = getattr(mmap_module, "MAP_POPULATE", 0)
    if size and populate and hasattr(mmap_module, "MAP_ANONYMOUS"):
        flags = mmap_module.MAP_PRIVATE | mmap_module.MAP_ANONYMOUS | populate
        return np.frombuffer(mmap_module.mmap(-1, size, flags=flags), np.uint8)
    root = np.empty(size + ALIGNMENT, np.uint8)
    start = -root.ctypes.data % ALIGNMENT
    return root[start : start + size]


def release_pages(buffer: np.ndarray) -> None:
    """Unmap the pages of a file mapped by :func:`read_whole` from this process (the page
    cache keeps them, and a later read maps them again): they stop counting in its memory."""
    base = buffer.base
    mapping = base.obj if isinstance(base, memoryview) else base
    if isinstance(mapping, mmap_module.mmap) and hasattr(mmap_module, "MADV_DONTNEED"):
        mapping.madvise(mmap_module.MADV_DONTNEED)
