"""Several processes compiling CpuAcc's kernels into one numba disk cache at once.

numba's cache has no notion of another process: two processes that miss the same function
and signature both compile it, and its index file (signature -> data file) is read, changed
and written back without a lock, so two processes saving different signatures of one
function at once can lose an entry, or give both signatures the same data file: the second
then loads the first's code. For this package's functions (``cache_stamp``'s locators),
:func:`install` adds to numba's ``Cache``:

- **a lock around each save** (``flock`` on a file beside the entries), so entries are never
  lost or shared;
- **a claim per missing entry**: a process that misses an entry creates
  ``<function>.<key digest>.claim`` (its pid inside, created exclusively) before compiling,
  and removes it once the entry is saved. A process that finds the entry claimed by another
  live process waits for the entry (:data:`WAIT_LIMIT` at most) instead of compiling it too
  -- or, in a compile-ahead helper (``compile_ahead``), raises :class:`Claimed` so that the
  helper moves on to other work. A claim whose process is gone, or older than
  :data:`STALE_AFTER`, is taken over.

Where ``fcntl`` is missing (Windows) nothing is installed: one process compiles alone there.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from numba.core import caching

try:
    import fcntl
except ImportError:  # Windows: no compile-ahead helpers, so nothing to coordinate
    fcntl = None  # type: ignore[assignment]

AVAILABLE = fcntl is not None
WAIT_LIMIT = 120.0  # seconds a process waits for another's entry before compiling it itself
STALE_AFTER = 600.0  # seconds after which a claim is taken over whoever holds it
_POLL = 0.02


class Claimed(Exception):
    """In a helper process: the entry it needs is being compiled by another process."""


class _State:
    def __init__(self) -> None:
        self.installed = False
        self.helper = False  # this process is a compile-ahead helper: never wait
        self.on_compile: Callable[[], None] | None = None  # called as this process starts a compile
        self.held: dict[tuple[int, str], str] = {}  # (id(cache), signature) -> claim path
        self.lock = threading.Lock()
        self.is_ours: Callable[[Any], bool] = lambda cache: False


_state = _State()


def install(is_ours: Callable[[Any], bool]) -> None:
    """Add the save lock and the claims to numba's ``Cache``, for the caches ``is_ours`` takes
    (once per process; nothing where ``fcntl`` is missing)."""
    if _state.installed or not AVAILABLE:
        return
    _state.installed, _state.is_ours = True, is_ours
    load, save = caching.Cache.load_overload, caching.Cache.save_overload

    def load_overload(self: Any, sig: Any, target_context: Any) -> Any:
        found = load(self, sig, target_context)
        if found is not None or not _state.is_ours(self):
            return found
        return _claim_or_wait(self, sig, target_context, load)

    def save_overload(self: Any, sig: Any, data: Any) -> None:
        if not _state.is_ours(self):
            save(self, sig, data)
            return
        try:
            with _index_lock(self):
                save(self, sig, data)
        finally:
            _release(self, sig)

    caching.Cache.load_overload = load_overload  # type: ignore[method-assign]
    caching.Cache.save_overload = save_overload  # type: ignore[method-assign]


def become_helper() -> None:
    """This process is a compile-ahead helper: an entry claimed by another raises Claimed."""
    _state.helper = True


def on_compile(callback: Callable[[], None] | None) -> None:
    """Call ``callback`` (once) when this process next starts compiling one of the package's
    functions; None takes it back."""
    _state.on_compile = callback


def release_all() -> None:
    """Remove every claim this process holds: after a failed compile, which saves nothing."""
    with _state.lock:
        paths, _state.held = list(_state.held.values()), {}
    for path in paths:
        _remove_own(path)


def _claim_path(cache: Any, sig: Any, target_context: Any) -> str:
    key = cache._index_key(sig, target_context.codegen())
    digest = hashlib.sha1(repr(key).encode()).hexdigest()[:16]
    return os.path.join(cache.cache_path, f"{cache._cache_file._index_name}.{digest}.claim")


def _claim_or_wait(cache: Any, sig: Any, target_context: Any, load: Callable[..., Any]) -> Any:
    """Claim the entry and return None (the caller compiles it), or return it once another
    process has saved it."""
    path = _claim_path(cache, sig, target_context)
    deadline = time.monotonic() + WAIT_LIMIT
    while True:
        if _take(path):
            found = load(cache, sig, target_context)  # saved between the miss and the claim
            if found is not None:
                _remove_own(path)
                return found
            with _state.lock:
                _state.held[(id(cache), str(sig))] = path
            callback, _state.on_compile = _state.on_compile, None
            if callback is not None:
                callback()
            return None
        if _state.helper:
            raise Claimed(f"{os.path.basename(path)} is being compiled by another process")
        time.sleep(_POLL)
        found = load(cache, sig, target_context)
        if found is not None:
            return found
        if time.monotonic() > deadline:
            return None  # compile it here: the other process is stuck or very slow


def _take(path: str) -> bool:
    """Create the claim at ``path`` for this process; False while another live process holds it.

    The claim appears with its pid already inside (written to a file of this process's own,
    then hard-linked to ``path``, which fails if ``path`` exists): a claim created empty and
    filled afterwards would look ownerless, hence stale, to a process reading it in between.
    """
    own = f"{path}.{os.getpid()}.{threading.get_ident()}"
    try:
        with open(own, "w") as f:
            f.write(str(os.getpid()))
    except OSError:
        return True  # no claims in this directory: compile without one
    try:
        try:
            os.link(own, path)
            return True
        except FileExistsError:
            pass
        except OSError:
            return True  # no hard links here: compile without a claim
        # Taking over a stale claim happens under the directory's lock, so that two processes
        # finding it stale do not both remove it (the second would remove the first's claim).
        with _directory_lock(os.path.dirname(path)):
            if not _stale(path):
                return False
            with contextlib.suppress(OSError):
                os.unlink(path)
            try:
                os.link(own, path)
            except OSError:
                return False
            return True
    finally:
        with contextlib.suppress(OSError):
            os.unlink(own)


def _stale(path: str) -> bool:
    """Whether the claim at ``path`` is this process's own, or its holder is gone or too old."""
    try:
        with open(path) as f:
            pid = int(f.read() or 0)
        age = time.time() - os.stat(path).st_mtime
    except (OSError, ValueError):
        return True
    if pid == os.getpid() or pid <= 0 or age > STALE_AFTER:
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False  # alive, another user's
    return False


def _release(cache: Any, sig: Any) -> None:
    with _state.lock:
        path = _state.held.pop((id(cache), str(sig)), None)
    if path is not None:
        _remove_own(path)


def _remove_own(path: str) -> None:
    with contextlib.suppress(OSError, ValueError):
        with open(path) as f:
            if int(f.read() or 0) != os.getpid():
                return
        os.unlink(path)


def _index_lock(cache: Any) -> contextlib.AbstractContextManager[None]:
    """An exclusive ``flock`` on the cache directory's lock file while an entry is saved."""
    return _directory_lock(cache.cache_path)


@contextlib.contextmanager
def _directory_lock(directory: str) -> Iterator[None]:
    """An exclusive ``flock`` on ``directory``'s lock file."""
    assert fcntl is not None  # install() installs nothing without it
    try:
        fd = os.open(os.path.join(directory, "flowrt-index.lock"), os.O_CREAT | os.O_RDWR, 0o644)
    except OSError:
        yield  # an unwritable directory: numba's save fails on its own
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing drops the lock
