"""Transformed weights made once per process and shared (Arm NN's ``IWeightsManager``, ONNX
Runtime's shared prepacked weights).

A backend turns a layer's constant weights into the form its kernels read (register-tile
panels, Winograd transforms of the filters, int8 panels). Made per load, a second load of the
same optimized network, each batch size of a batching stream and each runtime of the process
paid those bytes again. :func:`shared` makes each transform of each constant once: the key is
the constant itself (the array that owns its memory, the offset, shape, strides and dtype of
the view given) with the transform's name and parameters, and the value lives as long as
someone holds it: the manager keeps only weak references, and forgets a constant's transforms
when the constant is freed (so an address reused by a later array never finds a stale entry).
Constants are read-only to the engine once optimized, so the constant's identity stands for
its content.

A load gathers what its layers took in a :class:`WeightsRecord` (``recording``): each
transform's bytes, and whether an earlier user had made it (shared) or this load did (own);
``LoadedNetwork.memory_report`` shows both beside the arenas.

Transforms can also last past the process (:meth:`WeightsManager.keep_on_disk`): the cache of
optimized networks (``flowrt.network_cache``) maps its entries, files that never change once
written, and names a folder beside each. A transform asked for with ``lasting=True`` of a
constant in such a file is then read from that folder, mapped (its pages shared with every
process mapping it, read from disk only when touched), or made and written there for the
next process. It is keyed by the constant's place in the file and the transform's name and
parameters: those must name everything the result hangs on besides the constant (a layout
chosen by the host's features included), as a file made on one machine may be read on another.
"""

from __future__ import annotations

import contextlib
import contextvars
import hashlib
import logging
import os
import threading
import weakref
from collections.abc import Callable, Hashable, Iterator
from pathlib import Path
from typing import Any

import attrs
import numpy as np

logger = logging.getLogger(__name__)

# A transform smaller than this is made again rather than read from a file of its own.
MIN_LASTING_BYTES = 16 * 1024


@attrs.define
class WeightsRecord:
    """What one load's layers took from the manager, by backend: bytes made by this load
    (``own``) and bytes found made by an earlier one (``shared``)."""

    own: dict[str, int] = attrs.Factory(dict)
    shared: dict[str, int] = attrs.Factory(dict)
    backend: str = ""

    def add(self, nbytes: int, found: bool) -> None:
        into = self.shared if found else self.own
        into[self.backend] = into.get(self.backend, 0) + nbytes


_recording: contextvars.ContextVar[WeightsRecord | None] = contextvars.ContextVar(
    "flowrt_weights_record", default=None
)


@contextlib.contextmanager
def recording(record: WeightsRecord, backend: str) -> Iterator[WeightsRecord]:
    """Count in ``record``, under ``backend``, every transform taken in this context."""
    record.backend = backend
    token = _recording.set(record)
    try:
        yield record
    finally:
        _recording.reset(token)


def _key(owner: np.ndarray, source: np.ndarray, transform: str, params: Hashable) -> tuple:
    """A transform's key: the constant (its owner, address, shape, strides and dtype) and the
    transform with its parameters."""
    address = source.__array_interface__["data"][0]
    return (id(owner), address, source.shape, source.strides, source.dtype.str, transform, params)


def _owner(array: np.ndarray) -> np.ndarray:
    """The array at the root of ``array``'s chain of views: it keeps the memory alive."""
    while isinstance(array.base, np.ndarray):
        array = array.base
    return array


class WeightsManager:
    """The process's transformed weights (one instance: :data:`MANAGER`); thread-safe, as
    loads run on CPU workers."""

    def __init__(self) -> None:
        # reentrant: a weak reference's callback may run where a value is dropped under it
        self._lock = threading.RLock()
        # key -> (a tuple?, weak references to the transform's arrays (one, or each of a
        # tuple's), the bytes they hold of their own: a view of the constant holds none)
        self._values: dict[tuple, tuple[bool, tuple[weakref.ref, ...], int]] = {}
        self._watched: set[int] = set()  # ids of owners whose freeing forgets their keys
        # ids of owners whose constants' lasting transforms live on disk -> (folder, address)
        self._folders: dict[int, tuple[Path, int]] = {}

    def keep_on_disk(self, owner: np.ndarray, folder: Path) -> None:
        """Keep the lasting transforms of the constants in ``owner`` (a mapped file that never
        changes: its views are the constants) in ``folder``, made when first written to."""
        key = id(owner)
        with self._lock:
            self._folders[key] = (Path(folder), owner.__array_interface__["data"][0])
        weakref.finalize(owner, self._folders.pop, key, None)

    def shared(
        self,
        source: np.ndarray,
        transform: str,
        params: Hashable,
        make: Callable[[], Any],
        lasting: bool = False,
    ) -> Any:
        """``make()``, the ``transform`` (with ``params``) of the constant ``source``: an
        ndarray, a tuple of them, or an attrs instance holding them, made once while anyone
        holds it: a later call for the same constant and transform returns the same object.
        The caller holds what it gets; nothing here keeps it alive. ``lasting``: an ndarray
        that may be kept on disk (:meth:`keep_on_disk`), so ``params`` name all it hangs on."""
        owner = _owner(source)
        key = _key(owner, source, transform, params)
        with self._lock:
            value, nbytes = self._alive_locked(key)
            folder = self._folders.get(id(owner)) if lasting and value is None else None
        found = value is not None
        if value is None:
            path = None if folder is None else _lasting_path(folder, source, transform, params)
            value = None if path is None else _read_lasting(path)
            if value is None:
                value = make()
                if lasting and isinstance(value, np.ndarray):
                    # as read back: read-only (a kernel's types must not hang on where it came from)
                    value.flags.writeable = False
                if path is not None:
                    _write_lasting(path, value, source)
            with self._lock:
                earlier, earlier_bytes = self._alive_locked(key)
                if earlier is not None:  # made meanwhile by another load: take that one
                    value, nbytes, found = earlier, earlier_bytes, True
                else:
                    forget = self._forget_value(key)
                    held = value if isinstance(value, tuple) else (value,)
                    refs = tuple(weakref.ref(a, forget) for a in held)
                    nbytes = sum(a.nbytes for a in _arrays(value) if not np.may_share_memory(a, source))
                    self._values[key] = (isinstance(value, tuple), refs, nbytes)
                    if id(owner) not in self._watched:
                        self._watched.add(id(owner))
                        weakref.finalize(owner, self._forget_owner, id(owner))
        record = _recording.get()
        if record is not None:
            record.add(nbytes, found)
        return value

    def holds(self, source: np.ndarray, transform: str, params: Hashable) -> bool:
        """Whether the ``transform`` (with ``params``) of the constant ``source`` is alive: an
        algorithm that reads it costs no new bytes."""
        with self._lock:
            return self._alive_locked(_key(_owner(source), source, transform, params))[0] is not None

    def _alive_locked(self, key: tuple) -> tuple[Any, int]:
        """The value under ``key`` and its own bytes, or (None, 0) where none is alive."""
        entry = self._values.get(key)
        if entry is None:
            return None, 0
        is_tuple, refs, nbytes = entry
        arrays = tuple(ref() for ref in refs)
        if any(a is None for a in arrays):
            return None, 0
        return (arrays if is_tuple else arrays[0]), nbytes

    def _forget_value(self, key: tuple) -> Callable[[weakref.ref], None]:
        def forget(ref: weakref.ref) -> None:
            with self._lock:
                entry = self._values.get(key)
                if entry is not None and ref in entry[1]:
                    del self._values[key]

        return forget

    def _forget_owner(self, owner_id: int) -> None:
        with self._lock:
            self._watched.discard(owner_id)
            for key in [k for k in self._values if k[0] == owner_id]:
                del self._values[key]

    def held_bytes(self) -> int:
        """Bytes of the transformed weights alive now, each counted once (a view of its
        constant counts none)."""
        with self._lock:
            return sum(self._alive_locked(k)[1] for k in list(self._values))

    def __len__(self) -> int:
        with self._lock:
            return sum(self._alive_locked(k)[0] is not None for k in list(self._values))


def _lasting_path(
    folder: tuple[Path, int], source: np.ndarray, transform: str, params: Hashable
) -> Path | None:
    """The file of a lasting transform of ``source``, a view of the file mapped at
    ``folder[1]``: named by the view's place there and the transform (None where the
    parameters' text would differ in another process)."""
    where, base = folder
    offset = source.__array_interface__["data"][0] - base
    text = repr((offset, source.shape, source.strides, source.dtype.str, transform, params))
    if " at 0x" in text:
        return None
    return where / f"{hashlib.sha1(text.encode()).hexdigest()[:32]}.npy"


def _read_lasting(path: Path) -> np.ndarray | None:
    """The transform kept in ``path``, mapped read-only, or None where there is none (or it
    cannot be read: it is made and written again)."""
    try:
        mapped = np.load(path, mmap_mode="r", allow_pickle=False)
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as e:
        logger.info("transformed weights %s unreadable, made again: %s", path, e)
        return None
    return mapped.view(np.ndarray)


def _write_lasting(path: Path, value: Any, source: np.ndarray) -> None:
    """Write ``value`` to ``path`` for later processes, whole or not at all: an ndarray of its
    own memory (not a view of the constant), contiguous, worth a file."""
    if (
        not isinstance(value, np.ndarray)
        or value.nbytes < MIN_LASTING_BYTES
        or not (value.flags.c_contiguous or value.flags.f_contiguous)
        or np.may_share_memory(value, source)
    ):
        return
    tmp = path.with_name(f"{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    try:
        path.parent.mkdir(mode=0o700, exist_ok=True)
        with open(tmp, "wb") as f:
            np.lib.format.write_array(f, value, allow_pickle=False)
        os.replace(tmp, path)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        logger.info("transformed weights not kept in %s: %s", path, e)


def _arrays(value: Any) -> list[np.ndarray]:
    """The arrays a transform's value holds (itself, a tuple's, an attrs instance's fields)."""
    if isinstance(value, np.ndarray):
        return [value]
    items = value if isinstance(value, tuple) else [getattr(value, f.name) for f in attrs.fields(type(value))]
    return [a for a in items if isinstance(a, np.ndarray)]


MANAGER = WeightsManager()
