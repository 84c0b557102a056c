"""Dynamic backends: third-party backends found at runtime creation, as Arm NN's DynamicBackend.

Two sources, scanned in this order:

- *backend files* in the directories of ``Runtime(backend_paths=[...])`` or, when that is not
  given, of the ``FLOWRT_BACKEND_PATHS`` environment variable (colon-separated). A directory
  must exist and be given by an absolute path. A file is a candidate when its name is
  ``<Vendor>_<Name>_backend.py`` with both fields ASCII alphanumeric; a symbolic link counts by
  its own name, as in Arm NN. A candidate is imported by file path under a private module name
  (never through ``sys.path``). Directories and files are trusted as ssh trusts its files
  (:mod:`flowrt.trusted_paths`): a directory or file that someone other than you or root owns
  or may write, itself or any directory above it (after following symbolic links, ``/tmp``
  included), is skipped with the reason;
- the ``flowrt.backends`` entry-point group of installed distributions; an entry point loads a
  module or object.

Either way the module (or object) exposes ``get_backend_id() -> str``, ``get_version() ->
(major, minor)`` and ``backend_factory() -> Backend``. A backend is loaded when its version has
the major of :data:`flowrt.registry.BACKEND_API_VERSION` and a minor no greater than its minor.
Anything wrong — a bad path, a module that fails to import, a missing or raising function, an
incompatible version, an id already taken, a factory that makes no backend — skips that one
candidate with a logged warning saying which and why, and never stops the runtime. The
:class:`DynamicBackendReport` records every decision; :func:`format_report` prints it.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import itertools
import logging
import os
import re
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import attrs

import flowrt.registry as registry_package
from flowrt import trusted_paths
from flowrt.registry.backend_registry import BackendRegistry, backend_registry
from flowrt.registry.protocols import Backend

logger = logging.getLogger(__name__)

BACKEND_PATHS_ENV = "FLOWRT_BACKEND_PATHS"
ENTRY_POINT_GROUP = "flowrt.backends"

# Arm NN's rule is ^[a-zA-Z0-9]+_[a-zA-Z0-9]+_backend.so$; ours ends in .py.
BACKEND_FILE_NAME = re.compile(r"[A-Za-z0-9]+_[A-Za-z0-9]+_backend\.py")

_REQUIRED_FUNCTIONS = ("get_backend_id", "get_version", "backend_factory")
# The Backend protocol's members, read from the protocol itself so the two never drift apart.
_BACKEND_MEMBERS = tuple(name for name in vars(Backend) if not name.startswith("_"))
_module_numbers = itertools.count()

PathLike = str | os.PathLike[str]
# One directory or a list of them; None means "read FLOWRT_BACKEND_PATHS".
BackendPaths = PathLike | Sequence[PathLike] | None


@attrs.frozen
class LoadedBackend:
    """A dynamic backend that was registered: its id, version and where it came from."""

    id: str
    version: tuple[int, int]
    source: str


@attrs.frozen
class SkippedBackend:
    """A backend path, file or entry point that was not loaded, and why."""

    source: str
    reason: str


@attrs.frozen
class DynamicBackendReport:
    """What one scan did.

    ``paths``: the backend directories searched (after skipping invalid ones); ``found``: every
    candidate in scan order (backend files by path, then entry points as ``entry point NAME =
    VALUE``); ``loaded``: the backends registered; ``skipped``: the paths and candidates that
    were not loaded, with the reason (also logged as a warning).
    """

    paths: tuple[str, ...] = ()
    found: tuple[str, ...] = ()
    loaded: tuple[LoadedBackend, ...] = ()
    skipped: tuple[SkippedBackend, ...] = ()

    @property
    def ids(self) -> list[str]:
        """The ids of the loaded backends, in load order."""
        return [backend.id for backend in self.loaded]


class _Skip(Exception):
    """Raised inside the loader to skip one candidate; the message is the reason."""


class _Scan:
    """The mutable state of one scan; frozen into a DynamicBackendReport at the end."""

    def __init__(self) -> None:
        self.paths: list[str] = []
        self.found: list[str] = []
        self.loaded: list[LoadedBackend] = []
        self.skipped: list[SkippedBackend] = []

    def skip(self, source: str, reason: str, what: str = "dynamic backend") -> None:
        logger.warning("skipping %s %s: %s", what, source, reason)
        self.skipped.append(SkippedBackend(source, reason))

    def report(self) -> DynamicBackendReport:
        return DynamicBackendReport(
            tuple(self.paths), tuple(self.found), tuple(self.loaded), tuple(self.skipped)
        )


def advertised_entry_points() -> Sequence[Any]:
    """The entry points of the ``flowrt.backends`` group; each has ``name``, ``value`` and
    ``load()``. The one place installed distributions are asked (tests replace it)."""
    return list(importlib.metadata.entry_points(group=ENTRY_POINT_GROUP))


def check_backend_version(version: Any, api: tuple[int, int] | None = None) -> tuple[int, int]:
    """``version`` as ``(major, minor)`` when a backend of that version can be loaded by a
    runtime of Backend API ``api`` (default: ``flowrt.registry.BACKEND_API_VERSION``);
    ValueError saying why not otherwise. The rule is Arm NN's: same major, minor no greater."""
    api = api or registry_package.BACKEND_API_VERSION
    if (
        not isinstance(version, tuple | list)
        or len(version) != 2
        or not all(isinstance(v, int) and not isinstance(v, bool) for v in version)
    ):
        raise ValueError(f"get_version() must return (major, minor) as two ints, got {version!r}")
    major, minor = version
    if major < 0 or minor < 0:
        raise ValueError(f"version numbers must not be negative, got {major}.{minor}")
    if major != api[0] or minor > api[1]:
        raise ValueError(
            f"version {major}.{minor} is not compatible with flowrt's Backend API {api[0]}.{api[1]} "
            f"(needs major {api[0]} and minor <= {api[1]})"
        )
    return major, minor


def _path_problem(path: Path) -> str | None:
    if not path.is_absolute():
        return "the path is not absolute"
    if not path.exists():
        return "the path does not exist"
    if not path.is_dir():
        return "the path is not a directory"
    return _untrusted(path)


def _untrusted(path: Path) -> str | None:
    problem = trusted_paths.untrusted_reason(path, allow_sticky=True)
    return f"untrusted, others could write code there: {problem}" if problem else None


def _configured_paths(backend_paths: BackendPaths) -> list[Path]:
    if backend_paths is None:
        raw = os.environ.get(BACKEND_PATHS_ENV, "")
        return [Path(p) for p in raw.split(os.pathsep) if p]
    if isinstance(backend_paths, str | os.PathLike):
        return [Path(backend_paths)]
    return [Path(p) for p in backend_paths]


def _backend_directories(backend_paths: BackendPaths, scan: _Scan) -> list[Path]:
    directories: dict[Path, Path] = {}
    for path in _configured_paths(backend_paths):
        problem = _path_problem(path)
        if problem:
            scan.skip(str(path), problem, what="backend path")
        else:
            # The same directory named twice is searched once.
            directories.setdefault(path.resolve(), path)
    scan.paths = [str(p) for p in directories.values()]
    return list(directories.values())


def _backend_files(directories: Iterable[Path], scan: _Scan) -> list[Path]:
    """Candidate files by name; dangling links and non-files are skipped with a warning."""
    files: list[Path] = []
    targets: dict[Path, Path] = {}
    for directory in directories:
        try:
            entries = sorted(directory.iterdir())
        except OSError as e:
            scan.skip(str(directory), f"it cannot be listed: {e}", what="backend path")
            continue
        for entry in entries:
            if not BACKEND_FILE_NAME.fullmatch(entry.name):
                continue
            scan.found.append(str(entry))
            if entry.is_symlink() and not entry.exists():
                scan.skip(str(entry), f"dangling symbolic link to {os.readlink(entry)}")
            elif not entry.is_file():
                scan.skip(str(entry), "not a regular file")
            elif problem := _untrusted(entry):
                scan.skip(str(entry), problem)
            elif entry.resolve() in targets:
                scan.skip(str(entry), f"the same file as {targets[entry.resolve()]}")
            else:
                targets[entry.resolve()] = entry
                files.append(entry)
    return files


def _import_file(path: Path) -> Any:
    """Import the module at ``path`` under a fresh private name, without touching sys.path."""
    name = f"_flowrt_dynamic_backend_{next(_module_numbers)}_{path.stem}"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise _Skip("importlib cannot load it as a Python module")
    module = importlib.util.module_from_spec(spec)
    # Present in sys.modules only while it runs: dataclasses, attrs and typing look their
    # module up there while its classes are created. Afterwards its functions hold it alive.
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except (Exception, SystemExit) as e:
        raise _Skip(f"import raised {type(e).__name__}: {e}") from e
    finally:
        sys.modules.pop(name, None)
    return module


def _call(provider: Any, function: str) -> Any:
    try:
        fn = getattr(provider, function)
    except Exception as e:
        raise _Skip(f"looking up {function} raised {type(e).__name__}: {e}") from e
    if not callable(fn):
        raise _Skip(f"{function} is not callable (it is a {type(fn).__name__})")
    try:
        return fn()
    except Exception as e:
        raise _Skip(f"{function}() raised {type(e).__name__}: {e}") from e


def _backend_problem(backend: Any) -> str | None:
    """Why ``backend`` does not satisfy the Backend protocol, or None when it does."""
    missing = []
    for name in _BACKEND_MEMBERS:
        try:
            value = getattr(backend, name)
        except Exception:
            missing.append(name)
            continue
        if callable(getattr(Backend, name, None)) and not callable(value):
            missing.append(name)
    if missing:
        return f"it lacks {', '.join(missing)}"
    return None


def _load_provider(
    provider: Any, source: str, registry: BackendRegistry, loaded_from: dict[str, str]
) -> LoadedBackend:
    """Check one module or object and register its backend; _Skip with the reason otherwise."""
    missing = [name for name in _REQUIRED_FUNCTIONS if not hasattr(provider, name)]
    if missing:
        raise _Skip(f"it does not define {', '.join(f'{name}()' for name in missing)}")
    backend_id = _call(provider, "get_backend_id")
    if not isinstance(backend_id, str) or not backend_id:
        raise _Skip(f"get_backend_id() must return a non-empty str, got {backend_id!r}")
    try:
        version = check_backend_version(_call(provider, "get_version"))
    except ValueError as e:
        raise _Skip(str(e)) from None
    if backend_id in loaded_from:
        raise _Skip(f"backend id {backend_id!r} was already loaded from {loaded_from[backend_id]}")
    if registry.is_registered(backend_id):
        raise _Skip(f"backend id {backend_id!r} is already registered")
    backend = _call(provider, "backend_factory")
    problem = _backend_problem(backend)
    if problem:
        raise _Skip(f"backend_factory() returned a {type(backend).__name__}, not a flowrt backend: {problem}")
    if backend.id != backend_id:
        raise _Skip(f"backend_factory() made a backend with id {backend.id!r}, not {backend_id!r}")
    try:
        registry.register(backend_id, provider.backend_factory)
    except Exception as e:  # another thread registered the id since we looked
        raise _Skip(str(e)) from e
    loaded_from[backend_id] = source
    return LoadedBackend(backend_id, version, source)


def _load_all(candidates: Iterable[tuple[str, Any]], registry: BackendRegistry, scan: _Scan) -> None:
    loaded_from: dict[str, str] = {}
    for source, load in candidates:
        try:
            backend = _load_provider(load(), source, registry, loaded_from)
        except _Skip as e:
            scan.skip(source, str(e))
            continue
        except Exception as e:  # a backend's oddity (a raising property, ...) must not stop us
            scan.skip(source, f"checking it raised {type(e).__name__}: {e}")
            continue
        logger.info("loaded dynamic backend %s %d.%d from %s", backend.id, *backend.version, source)
        scan.loaded.append(backend)


def _entry_point_candidates(scan: _Scan) -> list[tuple[str, Any]]:
    try:
        entry_points = advertised_entry_points()
    except Exception as e:
        scan.skip(f"entry point group {ENTRY_POINT_GROUP!r}", f"listing it raised {type(e).__name__}: {e}")
        return []
    candidates = []
    for entry_point in entry_points:
        source = f"entry point {entry_point.name} = {entry_point.value}"
        scan.found.append(source)
        candidates.append((source, _entry_point_loader(entry_point)))
    return candidates


def _entry_point_loader(entry_point: Any):
    def load() -> Any:
        try:
            return entry_point.load()
        except (Exception, SystemExit) as e:
            raise _Skip(f"loading it raised {type(e).__name__}: {e}") from e

    return load


def load_dynamic_backends(
    registry: BackendRegistry, backend_paths: BackendPaths = None
) -> DynamicBackendReport:
    """Find, check and register every dynamic backend in ``registry``; never raises for a bad one.

    ``backend_paths`` (a directory or a list of them) overrides ``FLOWRT_BACKEND_PATHS``; an
    empty list searches no directory. Entry points of ``flowrt.backends`` are always scanned.
    The caller owns what was registered: :func:`unload_dynamic_backends` takes it back.
    """
    scan = _Scan()
    files = _backend_files(_backend_directories(backend_paths, scan), scan)
    candidates = [(str(path), lambda path=path: _import_file(path)) for path in files]
    candidates += _entry_point_candidates(scan)
    _load_all(candidates, registry, scan)
    return scan.report()


def unload_dynamic_backends(registry: BackendRegistry, report: DynamicBackendReport) -> None:
    """Unregister the backends that ``report`` says were loaded (those still registered)."""
    for backend_id in report.ids:
        if registry.is_registered(backend_id):
            registry.unregister(backend_id)
            logger.info("unloaded dynamic backend %s", backend_id)


def scan_dynamic_backends(
    backend_paths: BackendPaths = None, registry: BackendRegistry | None = None
) -> DynamicBackendReport:
    """What :func:`load_dynamic_backends` would load into ``registry`` (default: the process
    default registry), registering nothing: for ``flowrt backends``."""
    return load_dynamic_backends((registry or backend_registry()).copy(), backend_paths)


def format_report(report: DynamicBackendReport) -> str:
    """The report as text, one decision a line, for ``flowrt backends``."""
    lines = [f"backend paths: {', '.join(report.paths) or 'none'}"]
    lines.append(f"found {len(report.found)}:")
    lines += [f"  {source}" for source in report.found]
    lines.append(f"loaded {len(report.loaded)}:")
    lines += [f"  {b.id} {b.version[0]}.{b.version[1]}  {b.source}" for b in report.loaded]
    lines.append(f"skipped {len(report.skipped)}:")
    lines += [f"  {s.source}: {s.reason}" for s in report.skipped]
    return "\n".join(lines)
