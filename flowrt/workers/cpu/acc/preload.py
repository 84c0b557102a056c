"""A network's kernels loaded from numba's cache at load, without running its layers.

A load warms each CpuAcc layer up by running it once on ones (``AccWorkload.prepare``), so
that the numba functions it calls are compiled, or loaded from numba's disk cache, at load
rather than in the first run. Which functions, for which argument types, is only known by
running the layer. So once a load of a network has warmed up, the signatures of the
package's cached functions the process holds are written down beside numba's own entries (a
*manifest*, keyed by the network's CpuAcc layers and the package's sources), and a later
process's load of the same network loads those signatures straight from the cache and skips
running its layers (resnet50: 0.2-0.3 s of a 0.5 s load, and the memory the runs on ones
took). When a signature of the manifest is not in the cache (it compiles), the load warms
up by running, as without a manifest. Layers whose work needs a function the manifest does
not list load it in their first run, as layers of unknown shapes always have.

What a process holds includes every network it loaded before: a process that had loaded
four other networks wrote resnet50's manifest with 83 functions (0.21 s to load) where a
fresh process writes 34 (0.09 s). So a manifest says whether it is *clean*, written by a load
that began in a process holding none of the package's functions. Any process replays a clean
one; an unclean one serves only processes that hold functions already (a later load of the
same network there, a test suite's), and a fresh process warms up by running instead and
writes the clean one in its place.

A function compiled only inside another's compilation (a callee: ``_dot1`` inside a GEMV
task) is not listed: its caller's cache entry holds its code, and loading it on its own cost
as much as loading a kernel (resnet50's manifest: 91 functions with its callees, 35 without).
"""

from __future__ import annotations

import hashlib
import importlib
import json
import logging
import os
import pickle
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from llvmlite.binding import ffi
from numba.core import event as ev
from numba.core.dispatcher import Dispatcher

from flowrt.workers.cpu.acc import cache_stamp, lazy_bitcode

logger = logging.getLogger(__name__)

PACKAGE = "flowrt.workers.cpu.acc"
FORMAT = 3

_state = threading.local()


def warm() -> bool:
    """Whether the load building workloads on this thread has loaded its kernels from a
    manifest: its layers need not run to warm up."""
    return bool(getattr(_state, "warm", False))


def network_key(network: Any, threads: int) -> str:
    """What the functions a load needs depend on: its CpuAcc layers (kind, attributes, the
    shapes and types in and out), the threads they plan for, and the package's sources."""
    layers = [
        (
            layer.kind,
            repr(layer.descriptor),
            [str(i.source.info) if i.source is not None else None for i in layer.inputs],
            [str(o.info) for o in layer.outputs],
        )
        for layer in network.graph.topological_order()
        if layer.backend == "CpuAcc"
    ]
    parts = [FORMAT, layers, threads, cache_stamp.stamp(), sys.version_info[:2]]
    return hashlib.sha1(json.dumps(parts, default=str).encode()).hexdigest()


def _cached_dispatchers() -> Iterator[tuple[str, str, Dispatcher]]:
    """(module, name, dispatcher) of every jitted function of the package imported so far
    that numba caches on disk under the package's stamp, defined at a module's top level."""
    for module_name, module in list(sys.modules.items()):
        if module is None or not module_name.startswith(PACKAGE):
            continue
        for name, value in list(vars(module).items()):
            if (
                isinstance(value, Dispatcher)
                and value.py_func.__module__ == module_name
                and value.py_func.__qualname__ == name
                and cache_stamp.is_ours(getattr(value, "_cache", None))
            ):
                yield module_name, name, value


def _manifest_dir() -> Path | None:
    """Beside numba's entries for the package (they go together), or None where numba's
    cache has no place for them."""
    from flowrt.workers.cpu.acc.calls import _parallel_tasks

    path = getattr(_parallel_tasks._cache, "_cache_path", None)
    return None if path is None else Path(path) / "manifests"


def _path(key: str) -> Path | None:
    where = _manifest_dir()
    return None if where is None else where / f"{key}.pickle"


def _held() -> set[tuple[str, str, Any]]:
    """(module, name, signature) of every overload of the package's cached functions held now."""
    return {(m, n, sig) for m, n, dispatcher in _cached_dispatchers() for sig in list(dispatcher.overloads)}


class _Callees(ev.Listener):
    """The overloads compiled inside another function's compilation (or loaded from the
    cache for it): their code is linked into their caller's, which the cache holds whole, so
    a later process need not load them. Listens to every compilation of the process; numba
    compiles one function at a time, under its compiler lock."""

    def __init__(self) -> None:
        self.depth = 0
        self.found: frozenset[tuple[str, str, Any]] = frozenset()
        self._before: set[tuple[str, str, Any]] = set()
        self._caller: tuple[str, str] = ("", "")

    def on_start(self, event: ev.Event) -> None:
        if self.depth == 0:
            self._before = _held()
            function = event.data["dispatcher"].py_func
            self._caller = (function.__module__, function.__qualname__)
        self.depth += 1

    def on_end(self, event: ev.Event) -> None:
        self.depth -= 1
        if self.depth == 0:
            added = {e for e in _held() - self._before if e[:2] != self._caller}
            self.found = self.found | added  # a new set: readers on other threads see either


_CALLEES = _Callees()
ev.register("numba:compile", _CALLEES)


def _fresh() -> bool:
    """Whether the process holds none of the package's functions: no load nor kernel has run
    in it yet."""
    return not _held()


def write(key: str, entries: set[tuple[str, str, Any]], clean: bool) -> None:
    """Write down ``entries`` (module, name, signature), the functions a load of ``key`` calls
    (``clean``: all the process held, loaded by this load alone)."""
    pickled = []
    for module_name, name, signature in sorted(entries, key=repr):
        try:
            pickled.append((module_name, name, pickle.dumps(signature)))
        except Exception:  # a type numba cannot pickle: loaded in the first run instead
            continue
    path = _path(key)
    if path is None or not pickled:
        return
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_bytes(pickle.dumps((FORMAT, clean, pickled)))
        os.replace(tmp, path)
    except OSError as e:  # a read-only cache: the next load warms up by running again
        logger.info("CpuAcc: cannot keep the kernel manifest in %s: %s", path, e)


def _resolve(module_name: str, name: str) -> Dispatcher | None:
    try:
        value = getattr(importlib.import_module(module_name), name, None)
    except ImportError:
        return None
    return value if isinstance(value, Dispatcher) else None


def _load(dispatcher: Dispatcher, signature: Any) -> bool:
    """Load ``dispatcher`` for ``signature`` (compiling it if it is not in the cache);
    whether it came from the cache or was there already."""
    if signature in dispatcher.overloads:
        return True
    misses = sum(dispatcher.stats.cache_misses.values())
    dispatcher.compile(signature)
    return sum(dispatcher.stats.cache_misses.values()) == misses


def replay(key: str, fresh: bool) -> bool:
    """Load the functions of ``key``'s manifest from numba's cache; whether there was one
    this process takes (``fresh``: it holds none of the package's functions, and takes only
    a clean manifest) and every function came from the cache (none compiled)."""
    path = _path(key)
    if path is None:
        return False
    try:
        version, clean, entries = pickle.loads(path.read_bytes())
        if version != FORMAT or (fresh and not clean):
            return False
        # Every module first: the symbols their code links to are published at import.
        wanted = [(_resolve(m, n), m, n, pickle.loads(s)) for m, n, s in entries]
    except Exception:  # none, unreadable or stale: warm up by running
        return False
    from flowrt.workers.cpu.acc import calls

    calls._register_parallel_tasks()  # the launchers' symbol, before any launcher is linked
    with _lock_events_off(), lazy_bitcode.deferred():
        for dispatcher, module_name, name, signature in wanted:
            if dispatcher is not None and not _load(dispatcher, signature):
                logger.info(
                    "CpuAcc: %s.%s compiled: the load warms its layers up by running", module_name, name
                )
                return False
    return True


@contextmanager
def _lock_events_off() -> Iterator[None]:
    """numba broadcasts an event each time llvmlite's lock is taken and given back, for its
    compile timers: loading a function from the cache takes it ~140 times (reading the
    symbols of its module one call at a time), so resnet50's replay broadcast 11,000 events,
    ~15 ms of its ~115. Its callbacks are taken off for the replay and put back after; what a
    compile on another thread meanwhile loses is the lock's share of its timings."""
    lock = getattr(ffi.lib, "_lock", None)  # llvmlite's lock around the library's calls
    callbacks = list(getattr(lock, "_cblist", ()))
    for callback in callbacks:
        ffi.unregister_lock_callback(*callback)
    try:
        yield
    finally:
        for callback in callbacks:
            ffi.register_lock_callback(*callback)


class Preload:
    """Around the building of one load's workloads on this thread: loads the network's
    manifest, if it has one this process takes, and marks the load warm; after a load that
    warmed up by running, writes down the functions the process holds, less those compiled
    only as callees (clean where the process held none before)."""

    def __init__(self, network: Any, threads: int) -> None:
        self.key = network_key(network, threads)
        self.replayed = False
        self.fresh = False

    def __enter__(self) -> Preload:
        self.fresh = _fresh()
        self.replayed = replay(self.key, self.fresh)
        _state.warm = self.replayed
        return self

    def __exit__(self, kind: object, *exc_info: object) -> None:
        _state.warm = False
        if kind is None and not self.replayed:
            write(self.key, _held() - _CALLEES.found, clean=self.fresh)
