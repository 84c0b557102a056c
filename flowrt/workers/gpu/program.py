"""OpenCL programs: built once per device and context, their binaries cached on disk.

A program is one ``kernels/<name>.cl`` file with ``kernels/common.cl`` in front of it, built
with optional defines (``-D`` options: one program per tiling of gemm.cl, say), with
``GPU_DEVICE`` defined on a GPU, and with the options ``FLOWRT_OPENCL_BUILD_OPTIONS`` holds, if
any. The first build on a machine compiles the source and, on a GPU, writes the device binary
to the cache directory (``FLOWRT_CACHE_DIR``, else ``~/.cache/flowrt``, under ``opencl/``); the file name
holds the device name, the driver version and a hash of the source and build options, so a
driver update or an edited kernel never loads a stale binary. A later process builds from
that binary and skips the compiler. A binary the driver refuses is logged and rebuilt.

A program is built on a thread of the cache's own (:meth:`ProgramCache.request`), so a load asks
for every program its layers need and goes on making them while the compiler works: NVIDIA's
compiler takes 0.2-0.8 s a program, and builds on several threads overlap in part (resnet50's
programs: 4.2 s one after another, 3.1 s on four threads, on an H200). A load waits for
the builds it asked for before it ends (``collecting`` and ``wait``), so one that fails fails
the load.

A binary is code the driver runs, so the cache is trusted as ssh trusts its files
(:mod:`flowrt.trusted_paths`): its directory is made with mode 0o700 and checked before every
read. One that someone other than you or root owns or may write (itself or a directory
above it; a sticky one like ``/tmp`` above it is fine) is neither read nor written: programs
are built from source, with a warning. A cache file that is not a regular file you own,
writable by you alone, is ignored (logged) and replaced.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import re
import tempfile
import threading
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextvars import ContextVar
from importlib import resources
from pathlib import Path
from typing import Any

from flowrt import trusted_paths
from flowrt.defaults import cache_root
from flowrt.errors import BackendError
from flowrt.workers.gpu.device import cl

logger = logging.getLogger(__name__)

BUILD_OPTIONS = "-cl-mad-enable"
# More build options for every program, such as -cl-opt-disable to rule out the OpenCL
# compiler's optimizations when a result looks wrong (or to build fast where speed is moot).
EXTRA_OPTIONS_ENV = "FLOWRT_OPENCL_BUILD_OPTIONS"
_PRELUDE = "common"
# Cache directories already warned about, so that each program's build does not warn again.
_warned_directories: set[tuple[Path, str]] = set()
# Builds at once per device: more threads than this made resnet50's builds no faster on an H200
# (NVIDIA's compiler runs largely one build at a time; a quarter of the time overlaps).
BUILD_THREADS = 4
# The program keys asked for where ``ProgramCache.collecting`` is active (a load making its
# workloads), for ``ProgramCache.wait``.
_asked: ContextVar[set[str] | None] = ContextVar("flowrt_gpu_programs_asked", default=None)


def cache_dir() -> Path:
    """Where program binaries are kept."""
    return cache_root() / "opencl"


def kernel_source(name: str) -> str:
    """The OpenCL C source of program ``name``: the shared prelude, then ``kernels/<name>.cl``."""
    folder = resources.files("flowrt.workers.gpu.kernels")
    try:
        body = (folder / f"{name}.cl").read_text()
    except FileNotFoundError:
        raise BackendError(f"GpuAcc has no kernel source {name}.cl in {folder}") from None
    return (folder / f"{_PRELUDE}.cl").read_text() + "\n" + body


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", text.strip())[:60]


def binary_path(name: str, device: Any, source: str, options: str) -> Path:
    """The cache file for program ``name`` (``source`` built with ``options``) on ``device``."""
    digest = hashlib.sha256(f"{options}\0{source}".encode()).hexdigest()[:24]
    driver = f"{device.platform.name} {device.driver_version}"
    return cache_dir() / f"{name}--{_slug(device.name)}--{_slug(driver)}--{digest}.bin"


class ProgramCache:
    """The built programs of one device and context, by name; thread-safe.

    ``builds`` counts how each program was made (``"source"`` or ``"binary"``), by name (with
    its defines after a space when it has any), so a test or ``flowrt`` can tell a warm start
    from a cold one.
    """

    def __init__(self, context: Any, device: Any, store_binaries: bool | None = None) -> None:
        self.context = context
        self.device = device
        # On a CPU device (PoCL's) a binary costs more than it saves: building from source
        # takes milliseconds there and PoCL caches the compiled kernels itself, while asking
        # for the binary compiles every kernel of the program again (4 s for a gemm.cl build).
        # So binaries are written for GPUs only, unless asked (``store_binaries``).
        self.store_binaries = (
            bool(device.type & cl.device_type.GPU) if store_binaries is None else store_binaries
        )
        self.builds: dict[str, str] = {}
        self._programs: dict[str, Future] = {}
        self._lock = threading.Lock()
        self._threads: ThreadPoolExecutor | None = None
        # A kernel may tell a GPU from a CPU device (PoCL's): GPU_DEVICE is defined on a GPU.
        self._device_defines = "-DGPU_DEVICE" if device.type & cl.device_type.GPU else ""

    def request(self, name: str, defines: str = "") -> str:
        """Start building program ``name`` with ``defines`` (``-D`` options) and the options of
        ``FLOWRT_OPENCL_BUILD_OPTIONS`` on a build thread, unless it is built or building
        already; returns its key for :meth:`get_key`. A failed build is built again when next
        asked for."""
        asked = " ".join(part for part in (defines, os.environ.get(EXTRA_OPTIONS_ENV, "").strip()) if part)
        key = f"{name} {asked}" if asked else name
        keys = _asked.get()
        if keys is not None:
            keys.add(key)
        with self._lock:
            future = self._programs.get(key)
            if future is None or (future.done() and future.exception() is not None):
                if self._threads is None:
                    self._threads = ThreadPoolExecutor(
                        BUILD_THREADS, thread_name_prefix="flowrt-opencl-build"
                    )
                options = " ".join(part for part in (BUILD_OPTIONS, self._device_defines, asked) if part)
                self._programs[key] = self._threads.submit(self._build, name, key, options)
        return key

    def get_key(self, key: str) -> Any:
        """The program ``request`` returned ``key`` for, once built; BackendError where its
        build failed."""
        with self._lock:
            future = self._programs[key]
        return future.result()

    def get(self, name: str, defines: str = "") -> Any:
        """Program ``name`` built with ``defines`` (``-D`` options) and the options of
        ``FLOWRT_OPENCL_BUILD_OPTIONS``, built on first use (from the disk cache when it can be)."""
        return self.get_key(self.request(name, defines))

    @contextlib.contextmanager
    def collecting(self) -> Iterator[set[str]]:
        """Note the keys of the programs asked for in the block (this thread and context), to
        :meth:`wait` for."""
        keys: set[str] = set()
        token = _asked.set(keys)
        try:
            yield keys
        finally:
            _asked.reset(token)

    def wait(self, keys: set[str]) -> None:
        """Wait until the programs of ``keys`` are built; the first failure's BackendError."""
        for key in sorted(keys):
            self.get_key(key)

    def _build(self, name: str, key: str, options: str) -> Any:
        source = kernel_source(name)
        path = binary_path(name, self.device, source, options)
        cache_trusted = _cache_directory_trusted(path.parent)
        binary = _read_binary(path) if cache_trusted else None
        if binary is not None:
            try:
                program = cl.Program(self.context, [self.device], [binary]).build(options)
            except cl.Error as e:
                logger.info("cached OpenCL binary %s is unusable, rebuilding from source: %s", path, e)
            else:
                self.builds[key] = "binary"
                return program
        try:
            program = cl.Program(self.context, source).build(options, devices=[self.device])
        except cl.Error as e:
            raise BackendError(
                f"GpuAcc failed to build {name}.cl ({options}) on {self.device.name!r}: {e}"
            ) from e
        self.builds[key] = "source"
        if cache_trusted and self.store_binaries:
            self._store(path, program)
        return program

    def _store(self, path: Path, program: Any) -> None:
        """Write the program's binary to ``path`` atomically; a cache that cannot be written is
        only logged (the next process compiles again)."""
        try:
            (binary,) = program.get_info(cl.program_info.BINARIES)
            fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
            with os.fdopen(fd, "wb") as f:
                f.write(binary)
            os.replace(tmp, path)
        except (OSError, cl.Error, ValueError) as e:
            logger.info("could not cache OpenCL binary at %s: %s", path, e)


def _cache_directory_trusted(directory: Path) -> bool:
    """Make ``directory`` (mode 0o700) if missing; True when only you or root can write it."""
    problem = trusted_paths.private_directory(directory)
    if problem is None:
        return True
    if (directory, problem) not in _warned_directories:
        _warned_directories.add((directory, problem))
        logger.warning(
            "not using the OpenCL binary cache %s, building programs from source: %s", directory, problem
        )
    return False


def _read_binary(path: Path) -> bytes | None:
    """The cached binary at ``path``, or None when there is none or it is not to be trusted
    (not a regular file you own and alone may write; a symbolic link is refused too)."""
    try:
        # No symbolic link, and never block on a FIFO put in its place.
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0))
    except FileNotFoundError:
        return None
    except OSError as e:
        logger.info("cached OpenCL binary %s is unusable, rebuilding from source: %s", path, e)
        return None
    with os.fdopen(fd, "rb") as f:
        # Judged on the open file, so that nothing can be swapped in between check and read.
        problem = trusted_paths.owned_file_problem(os.fstat(f.fileno()))
        if problem:
            logger.warning("ignoring cached OpenCL binary %s, rebuilding from source: %s", path, problem)
            return None
        try:
            return f.read()
        except OSError as e:
            logger.info("cached OpenCL binary %s is unusable, rebuilding from source: %s", path, e)
            return None
