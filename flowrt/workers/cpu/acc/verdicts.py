"""Launch-recording verdicts kept across processes, beside numba's cache.

Whether a layer's recorded launches replay exactly (``launches.replays_exactly``) depends on
its kernel's code, its kind and attributes, its tensors' shapes and types, which inputs are
constants, its fused activation, and the split it plans (its workers): not on which process
or which memory pool asks. Proving it runs the layer three times on arrays of its own, so a
pool's second run, which binds its layers, cost resnet50 0.5-0.8 s on a 2-core machine, in
every process. So each verdict is written down (one small file per version of the package's
sources, in the kernel manifests' directory: ``preload``) and a later process takes it from
there. Where the cache has no directory (or cannot be written), every process proves again.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import pickle
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from flowrt.workers.cpu.acc import cache_stamp, preload

logger = logging.getLogger(__name__)

FORMAT = 2  # a verdict: the seconds of the layer's work, or None where it is not recorded

_lock = threading.Lock()
_known: dict[str, float | None] = {}
_loaded_from: Path | None = None


def key(info: Any, split: str, workers: int) -> str:
    """What a verdict on layer ``info`` (a WorkloadInfo) split ``split`` on ``workers`` depends on."""
    constants = info.constants or ()
    parts = [
        FORMAT,
        info.kind,
        repr(info.descriptor),
        [str(i) for i in info.inputs],
        [str(o) for o in info.outputs],
        [i < len(constants) and constants[i] is not None for i in range(len(info.inputs))],
        repr(info.activation),
        split,
        workers,
    ]
    return hashlib.sha1(json.dumps(parts, default=str).encode()).hexdigest()


def _path() -> Path | None:
    where = preload._manifest_dir()
    if where is None:
        return None
    version = f"{sys.version_info[0]}{sys.version_info[1]}"
    return where / f"verdicts-{cache_stamp.stamp()[:16]}-py{version}.pickle"


def _read(path: Path) -> dict[str, float | None]:
    try:
        version, entries = pickle.loads(path.read_bytes())
    except Exception:  # none yet, unreadable or torn: prove again
        return {}
    return entries if version == FORMAT and isinstance(entries, dict) else {}


def proven(name: str, prove: Callable[[], float | None]) -> float | None:
    """The verdict kept under ``name``, else ``prove()``'s, then kept."""
    global _loaded_from
    path = _path()
    with _lock:
        if path is not None and _loaded_from != path:
            _known.clear()
            _known.update(_read(path))
            _loaded_from = path
        if name in _known:
            return _known[name]
    verdict = prove()
    with _lock:
        _known[name] = verdict
        if path is not None:
            _write(path, name, verdict)
    return verdict


def _write(path: Path, name: str, verdict: float | None) -> None:
    """Add one verdict to the file, keeping those other processes wrote meanwhile."""
    entries = _read(path)
    entries[name] = verdict
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.{threading.get_ident()}.tmp")
        tmp.write_bytes(pickle.dumps((FORMAT, entries)))
        os.replace(tmp, path)
    except OSError as e:  # a read-only cache: the verdicts stay in this process
        logger.info("CpuAcc: cannot keep launch verdicts in %s: %s", path, e)
