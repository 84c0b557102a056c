"""Checks of the command line's paths and options, made before any model is loaded or run.

A bad path or number must fail in the first second, naming the option, not after a long
load and run (an unwritable ``--output-dir`` used to fail only once every run had ended).
Each check raises a ``flowrt.errors`` error whose message names the option and the value.
"""

from __future__ import annotations

import contextlib
import math
import os
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np

from flowrt.errors import InputError, ModelLoadError


def model_file(path: str) -> str:
    """``path`` when it is a readable file; ModelLoadError saying what is wrong otherwise."""
    target = Path(path)
    if not target.exists():
        raise ModelLoadError(f"model {path}: no such file (expected an .onnx or .flowrt file)")
    if target.is_dir():
        raise ModelLoadError(f"model {path} is a directory; expected an .onnx or .flowrt file")
    try:
        with open(target, "rb"):
            pass
    except OSError as e:
        raise ModelLoadError(f"model {path} cannot be read: {e.strerror or e}") from e
    return path


def _nearest_existing(path: Path) -> Path:
    """``path`` or the closest of its parents that exists."""
    path = path.absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def _probe(directory: Path) -> None:
    """Create and remove a file in ``directory``: the OSError writing there would raise.

    ``os.access`` cannot stand in for this: it answers yes to root everywhere (CI runs as
    root) and to anyone under /proc, where the write then fails after the whole run.
    """
    with tempfile.NamedTemporaryFile(dir=directory, prefix=".flowrt-probe-"):
        pass


def output_dir(option: str, path: str) -> None:
    """Make the directory ``path`` if missing (as the command would) and check that a file can
    be written in it; InputError naming ``option`` and ``path`` otherwise."""
    target = Path(path)
    if target.exists() and not target.is_dir():
        raise InputError(f"{option} {path} exists and is not a directory")
    ancestor = _nearest_existing(target)
    if not ancestor.is_dir():
        raise InputError(f"{option} {path} cannot be made: {ancestor} is a file, not a directory")
    try:
        target.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise InputError(f"{option} {path} cannot be made in {ancestor}: {e.strerror or e}") from e
    try:
        _probe(target)
    except OSError as e:
        raise InputError(f"{option} {path} is not writable: {e.strerror or e}") from e


def output_file(option: str, path: str) -> None:
    """InputError unless ``path`` can be written as a file: a file can be made in its directory,
    and it is not a directory (nor an existing file that cannot be opened for writing)."""
    target = Path(path)
    if target.is_dir():
        raise InputError(f"{option} {path} is a directory; expected a file to write")
    parent = target.absolute().parent
    if not parent.is_dir():
        raise InputError(f"{option} {path}: directory {parent} does not exist")
    try:
        _probe(parent)
    except OSError as e:
        raise InputError(f"{option} {path}: directory {parent} is not writable: {e.strerror or e}") from e
    if target.is_file():
        try:
            with open(target, "ab"):  # appends nothing: the file is left as it was
                pass
        except OSError as e:
            raise InputError(f"{option} {path} exists and is not writable: {e.strerror or e}") from e


@contextlib.contextmanager
def writing(option: str, path: str | os.PathLike) -> Iterator[None]:
    """Turn an OSError while writing ``path`` (after the run: a full disk, a directory removed
    meanwhile) into an InputError naming ``option`` and ``path``: one line, not a traceback."""
    try:
        yield
    except OSError as e:
        raise InputError(f"{option}: writing {path} failed: {e.strerror or e}") from e


def _npy(name: str, path: str) -> np.ndarray:
    """The one array of the .npy file ``path``, or InputError naming ``--input NAME=FILE``."""
    where = f"--input {name}={path}"
    if not os.path.exists(path):
        raise InputError(f"{where}: no such file")
    if os.path.isdir(path):
        raise InputError(f"{where}: is a directory, expected a .npy file")
    try:
        loaded = np.load(path, allow_pickle=False)
    except EOFError:  # what numpy raises for an empty file (or /dev/null)
        raise InputError(
            f"{where}: the file is empty, expected a .npy file (numpy.save writes one)"
        ) from None
    except (OSError, ValueError) as e:
        raise InputError(f"{where}: not a readable .npy file ({e})") from e
    if not isinstance(loaded, np.ndarray):  # an .npz archive: several arrays, by name
        loaded.close()
        raise InputError(f"{where}: an .npz archive, expected a .npy file holding one array")
    return loaded


def input_files(items: Sequence[str]) -> dict[str, np.ndarray]:
    """``--input NAME=FILE.npy`` arguments read into ``{name: array}``."""
    feeds: dict[str, np.ndarray] = {}
    for item in items:
        name, sep, path = item.partition("=")
        if not sep or not name or not path:
            raise InputError(f"--input expects NAME=FILE.npy, got {item!r}")
        if name in feeds:
            raise InputError(f"--input {name} is given twice; give each input once")
        feeds[name] = _npy(name, path)
    return feeds


def at_least_one(option: str, value: int) -> int:
    """``value`` when it is at least 1; InputError naming ``option`` otherwise."""
    if value < 1:
        raise InputError(f"{option} must be at least 1, got {value}")
    return value


def threads(value: int | None) -> int | None:
    """``--threads``: None (the default) or a count of CPU workers the Runtime takes."""
    from flowrt.runtime import MAX_CPU_WORKERS

    if value is not None and not 1 <= value <= MAX_CPU_WORKERS:
        raise InputError(f"--threads must be from 1 to {MAX_CPU_WORKERS}, got {value}")
    return value


def seconds(option: str, value: float | None) -> float | None:
    """A positive finite number of seconds, or None; InputError naming ``option`` otherwise."""
    if value is not None and not 0 < value < math.inf:  # NaN fails both
        never = "" if value <= 0 else " (a finite one: the benchmark would never end)"
        raise InputError(f"{option} must be a positive number of seconds, got {value}{never}")
    return value


def importable(option: str, package: str, install: str) -> None:
    """InputError saying how to install ``package`` when ``option`` needs it and it is missing.
    Looked up without importing it, so the check costs nothing."""
    import importlib.util

    try:
        found = importlib.util.find_spec(package) is not None
    except (ImportError, ValueError):  # a broken install, or a None left in sys.modules
        found = False
    if not found:
        raise InputError(f"{option} needs the {package} package, which is not installed: {install}")
