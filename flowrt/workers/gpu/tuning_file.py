"""GpuAcc's tuning file: tuned local work sizes in msgpack.

The file is one msgpack map: ``{"format": "flowrt-opencl-tuning", "version": 1, "entries":
[[device name, driver version, kernel name, [global size...], [local size...]], ...]}``.
Entries of every device are kept, so one file serves several machines. An entry whose kernel
name ends in ``:plan`` holds a plan chosen by timing rather than a local size: for
``gemm:plan`` (and ``gemm_implicit:plan``), the GEMM's (M, N, K, batches) and its
(tile rows, tile columns, K splits). It is read with
msgpack's size limits (no ext types, no binary, short strings) and checked entry by entry: a
corrupt, truncated or foreign file is a BackendError that names the file and says what was
wrong, never a partly used table.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

import msgpack

from flowrt.errors import BackendError

FORMAT = "flowrt-opencl-tuning"
VERSION = 1
MAX_BYTES = 64 * 2**20
MAX_ENTRIES = 1_000_000

PLAN = ":plan"  # the kernel-name suffix of an entry that holds a plan
# (device name, driver version, kernel name, global size) -> local size (or a plan's key and plan)
TuningKey = tuple[str, str, str, tuple[int, ...]]
TuningEntries = dict[TuningKey, tuple[int, ...]]

_LIMITS = {
    "max_str_len": 4096,
    "max_bin_len": 0,
    "max_ext_len": 0,
    "max_array_len": MAX_ENTRIES,
    "max_map_len": 16,
}


def _problem(path: Path, problem: str) -> BackendError:
    return BackendError(f"tuning file {path}: {problem}")


def _read_bytes(path: Path) -> bytes:
    try:
        size = path.stat().st_size
        if size > MAX_BYTES:
            raise _problem(path, f"expected at most {MAX_BYTES} bytes, found {size}")
        return path.read_bytes()
    except OSError as e:
        raise _problem(path, f"cannot be read ({e.strerror or e})") from e


def _unpack(path: Path, data: bytes) -> Any:
    if not data:
        raise _problem(path, "is empty; expected a msgpack map")
    try:
        return msgpack.unpackb(data, raw=False, strict_map_key=True, **_LIMITS)
    except msgpack.ExtraData:
        raise _problem(path, "has bytes after its msgpack map: not a flowrt tuning file") from None
    except (ValueError, msgpack.UnpackException, TypeError) as e:
        detail = "truncated" if "incomplete" in str(e) else "not valid msgpack"
        raise _problem(path, f"is {detail} ({type(e).__name__}: {e})") from None


def _sizes(value: Any, most: int = 3) -> tuple[int, ...] | None:
    if not isinstance(value, list) or not 1 <= len(value) <= most:
        return None
    if not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in value):
        return None
    return tuple(value)


def _entry(path: Path, index: int, item: Any) -> tuple[TuningKey, tuple[int, ...]]:
    expected = "[device, driver, kernel, [global sizes], [local sizes]]"
    if not isinstance(item, list) or len(item) != 5:
        raise _problem(path, f"entry {index} expected {expected}, found {item!r:.80}")
    device, driver, kernel, global_size, local_size = item
    names_ok = all(isinstance(s, str) for s in (device, driver, kernel))
    plan = names_ok and kernel.endswith(PLAN)
    most = 4 if plan else 3
    dims, local = _sizes(global_size, most), _sizes(local_size, most)
    if not names_ok or dims is None or local is None or (not plan and len(dims) != len(local)):
        raise _problem(path, f"entry {index} expected {expected} with positive sizes, found {item!r:.80}")
    return (device, driver, kernel, dims), local


def read_tuning_file(path: str | Path) -> TuningEntries:
    """The entries of the tuning file at ``path``; BackendError naming it and the problem."""
    path = Path(path)
    document = _unpack(path, _read_bytes(path))
    if not isinstance(document, dict) or document.get("format") != FORMAT:
        found = document.get("format") if isinstance(document, dict) else type(document).__name__
        raise _problem(path, f"expected a map with format {FORMAT!r}, found {found!r:.80}")
    if document.get("version") != VERSION:
        raise _problem(path, f"expected version {VERSION}, found {document.get('version')!r:.40}")
    items = document.get("entries")
    if not isinstance(items, list):
        raise _problem(path, f"expected a list of entries, found {type(items).__name__}")
    return dict(_entry(path, i, item) for i, item in enumerate(items))


def write_tuning_file(path: str | Path, entries: TuningEntries) -> None:
    """Write ``entries`` to ``path`` atomically (a reader never sees half a file)."""
    path = Path(path)
    items = [[*key[:3], list(key[3]), list(local)] for key, local in sorted(entries.items())]
    data = msgpack.packb({"format": FORMAT, "version": VERSION, "entries": items})
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except OSError as e:
        raise _problem(path, f"cannot be written ({e.strerror or e})") from e
