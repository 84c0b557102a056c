"""``clEnqueueNDRangeKernel`` called through ctypes, asking for no event: how recorded launches
are replayed.

pyopencl's ``enqueue_nd_range_kernel`` makes an event object for every launch (the driver
creates, retains and releases it) and converts the sizes each time: on an H200, replaying
resnet50's launches, 0.8-1.5 us of the 14-16 a launch costs the host (the rest is the
driver's), and a run replays every launch of a model. The
OpenCL objects pyopencl made are plain handles (``int_ptr``) that any OpenCL library takes:
an ICD loader dispatches through the handle itself. So the library is the one pyopencl loaded
(found among the process's mapped files), else the system's; where neither is found, launches
go through pyopencl as before.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import sys
from collections.abc import Sequence
from typing import Any

from flowrt.errors import BackendError
from flowrt.workers.gpu.device import cl

_size_t3 = ctypes.c_size_t * 3


def _library_paths() -> list[str]:
    """The OpenCL libraries to try: the one mapped into this process (pyopencl's), then the
    system's."""
    paths = []
    if sys.platform.startswith("linux"):
        try:
            with open("/proc/self/maps") as maps:
                for line in maps:
                    path = line.split()[-1] if line.count(" ") >= 5 else ""
                    if "/libOpenCL" in path and path not in paths:
                        paths.append(path)
        except OSError:
            pass
    found = ctypes.util.find_library("OpenCL")
    paths += [p for p in (found, "libOpenCL.so.1") if p and p not in paths]
    return paths


@functools.cache
def _enqueue() -> Any | None:
    """The library's ``clEnqueueNDRangeKernel`` with its argument types, or None."""
    for path in _library_paths():
        try:
            function = ctypes.CDLL(path).clEnqueueNDRangeKernel
        except (OSError, AttributeError):
            continue
        function.restype = ctypes.c_int32
        function.argtypes = [
            ctypes.c_void_p, ctypes.c_void_p, ctypes.c_uint32, ctypes.c_void_p, ctypes.c_void_p,
            ctypes.c_void_p, ctypes.c_uint32, ctypes.c_void_p, ctypes.c_void_p,
        ]  # fmt: skip
        return function
    return None


def available() -> bool:
    """Whether launches can be enqueued directly in this process."""
    return _enqueue() is not None


def _error(code: int) -> str:
    try:
        return f"{cl.status_code.to_string(code)} ({code})"  # type: ignore[operator]  # stubs miss to_string
    except Exception:  # an unknown code
        return str(code)


class DirectLaunches:
    """Launches of kernels whose arguments are set, as the handles and sizes
    ``clEnqueueNDRangeKernel`` takes; ``kernels`` keeps the kernel objects alive."""

    __slots__ = ("_function", "_rows", "_sizes", "kernels")

    def __init__(self, launches: Sequence[tuple[Any, Sequence[int], Sequence[int] | None]]) -> None:
        function = _enqueue()
        if function is None:
            raise BackendError("no OpenCL library found to enqueue launches directly")
        self._function = function
        self.kernels = [kernel for kernel, _, _ in launches]
        self._sizes = []  # the size arrays the rows point into
        self._rows = []
        for kernel, global_size, local_size in launches:
            dims = len(global_size)
            g = _size_t3(*global_size)
            local = _size_t3(*local_size) if local_size is not None else None
            self._sizes.append((g, local))
            self._rows.append(
                (
                    kernel.int_ptr,
                    dims,
                    ctypes.addressof(g),
                    ctypes.addressof(local) if local is not None else None,
                )
            )

    def __len__(self) -> int:
        return len(self._rows)

    def enqueue(self, queue: Any, start: int = 0, stop: int | None = None) -> None:
        """Enqueue launches ``start`` to ``stop`` (the end by default) on ``queue``, in order."""
        enqueue, handle = self._function, queue.int_ptr
        for kernel, dims, global_size, local_size in self._rows[start:stop]:
            code = enqueue(handle, kernel, dims, None, global_size, local_size, 0, None, None)
            if code:
                raise BackendError(f"clEnqueueNDRangeKernel failed: {_error(code)}")
