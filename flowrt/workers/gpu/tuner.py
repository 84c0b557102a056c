"""The local-work-size tuner, as the Compute Library's CLTuner.

A kernel launched through :meth:`Tuner.enqueue` runs with the local work size tuned for its
(kernel name, global work size) on this device, else the default one. Tuning happens at load:
a workload enqueues itself once on the tuner's profiling queue (a queue made with
``PROFILING_ENABLE``, used for nothing else), and each launch that reaches that queue with no
size known yet is timed with every candidate of the mode (OpenCL event profiling) and keeps
the fastest. Modes: ``none`` (use what is known, time nothing), ``rapid`` (a few sizes),
``normal`` (every power of two) and ``exhaustive`` (every multiple of the device's preferred
work-group multiple too, each timed three times).

A kernel with a choice to make beyond its local size times its candidates through
:meth:`Tuner.choose` on the same queue: GpuAcc's GEMM, among the tilings and K splits its cost
model ranks first (3 in ``rapid``, 8 in ``normal``, every one in ``exhaustive``).

Results are keyed by (device name, driver version, kernel name, global size) and kept in a
msgpack tuning file (see :mod:`flowrt.workers.gpu.tuning_file`), read when the tuner is made
and written, atomically, after each load that tuned something new.
"""

from __future__ import annotations

import contextvars
import logging
import math
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from flowrt.errors import BackendError
from flowrt.workers.gpu.device import cl
from flowrt.workers.gpu.tuning_file import PLAN, TuningEntries, TuningKey, read_tuning_file, write_tuning_file
from flowrt.workers.gpu.tuning_mode import TuningMode

logger = logging.getLogger(__name__)

# One-dimensional kernels run in work-groups of this size when nothing is tuned.
DEFAULT_LOCAL_SIZE = 64
_LARGEST = 1024  # no candidate beyond this: no GPU gains from larger 1-D work-groups

# Called with a layer's name once GpuAcc has tuned it; ``flowrt tune`` draws its bar with it.
tuning_progress: contextvars.ContextVar[Callable[[str], None] | None] = contextvars.ContextVar(
    "tuning_progress", default=None
)


def device_identity(device: Any) -> tuple[str, str]:
    """What a tuning result is valid for: the device's name and driver version."""
    return device.name.strip(), device.driver_version.strip()


def candidate_sizes(mode: TuningMode, largest: int, multiple: int) -> list[int]:
    """The 1-D local sizes ``mode`` times, at most ``largest`` (the kernel's limit)."""
    if mode is TuningMode.RAPID:
        sizes = {32, DEFAULT_LOCAL_SIZE, 128, 256}
    else:
        sizes = {1 << p for p in range(0 if mode is TuningMode.EXHAUSTIVE else 4, 11)}
        if mode is TuningMode.EXHAUSTIVE:
            sizes |= set(range(multiple, _LARGEST + 1, max(multiple, 1)))
    return sorted(s for s in sizes | {DEFAULT_LOCAL_SIZE} if s <= min(largest, _LARGEST))


def rounded_up(n: int, local: int) -> int:
    """``n`` work-items in whole work-groups of ``local``."""
    return -(-n // local) * local


class Tuner:
    """Tuned local work sizes, for one runtime's GpuAcc (thread-safe).

    ``mode`` is a :class:`TuningMode` or its name. ``path`` names the tuning file: read now
    when it exists (BackendError naming it when it is corrupt, truncated or not a tuning
    file), written after a load that tuned something new. With mode ``none`` the file must
    exist. ``timed`` counts the candidate runs timed so far.
    """

    def __init__(self, mode: Any = TuningMode.NONE, path: str | Path | None = None) -> None:
        self.mode = TuningMode.parse(mode)
        self.path = Path(path) if path is not None else None
        self.entries: TuningEntries = {}
        self.timed = 0
        self._changed = False
        self._lock = threading.Lock()
        self._queues: dict[int, Any] = {}
        self._names: dict[Any, str] = {}
        self._identities: dict[int, tuple[str, str]] = {}
        if self.path is not None:
            if self.path.exists():
                self.entries = read_tuning_file(self.path)
            elif self.mode is TuningMode.NONE:
                raise BackendError(
                    f"tuning file {self.path} not found; with tuning_mode 'none' the file is only "
                    "read: give a mode such as 'rapid' to create it"
                )

    def check_device(self, device: Any) -> None:
        """BackendError naming the tuning file and the entry when an entry for ``device`` asks
        for a work-group larger than the device runs: only a corrupt or hand-edited file does
        (the tuner never times a size past the kernel's limit). Called when GpuAcc's context
        is made, so such a file fails there, as any other corrupt file, and not in a run."""
        identity = device_identity(device)
        largest = int(device.max_work_group_size)
        per_dim = [int(s) for s in device.max_work_item_sizes]
        for key, local in self.entries.items():
            if key[2].endswith(PLAN):
                continue  # a plan, not a local size: the kernel that reads it checks it
            fits = len(local) <= len(per_dim) and all(s <= most for s, most in zip(local, per_dim))
            if key[:2] == identity and not (fits and math.prod(local) <= largest):
                limit = f"at most {per_dim[: len(local)]}, {largest} in all, on {identity[0]!r}"
                raise self._entry_problem(
                    key, local, f"expected a local size of {limit}; found {list(local)}"
                )

    def _entry_problem(self, key: TuningKey, local: tuple[int, ...], problem: str) -> BackendError:
        entry = [*key[:3], list(key[3]), list(local)]
        where = f"tuning file {self.path}" if self.path is not None else "tuning table"
        return BackendError(f"{where}: entry {entry!r:.200} {problem}")

    @property
    def tunes(self) -> bool:
        """Whether loads time candidates (any mode but none)."""
        return self.mode is not TuningMode.NONE

    def profiling_queue(self, context: Any) -> Any:
        """The profiling-enabled queue of ``context``'s device: what tuning runs enqueue on."""
        with self._lock:
            queue = self._queues.get(id(context))
            if queue is None:
                props = cl.command_queue_properties.PROFILING_ENABLE
                queue = self._queues[id(context)] = cl.CommandQueue(context.context, context.device, props)
            return queue

    def tunes_on(self, queue: Any) -> bool:
        """Whether commands enqueued on ``queue`` are to be tuned: a tuning mode, and the
        profiling queue."""
        return self.tunes and queue in self._queues.values()

    def plan(self, device: Any, name: str, key: tuple[int, ...]) -> tuple[int, ...] | None:
        """The plan :meth:`choose` chose for kernel ``name`` over ``key`` on ``device``, if any."""
        return self.entries.get((*device_identity(device), name + PLAN, key))

    def choose(
        self,
        device: Any,
        name: str,
        key: tuple[int, ...],
        candidates: Sequence[tuple[tuple[int, ...], Callable[[], Sequence[Any]]]],
    ) -> tuple[int, ...]:
        """Time ``candidates`` (plan, enqueue), best guess first, each ``enqueue`` putting its
        commands on the profiling queue and returning their events; keep the fastest plan for
        ``name`` over ``key`` and return it. The mode decides how many are timed, and how often."""
        count = {TuningMode.RAPID: 3, TuningMode.NORMAL: 8}.get(self.mode, len(candidates))
        repeats = {TuningMode.RAPID: 1, TuningMode.NORMAL: 2}.get(self.mode, 3)
        best, best_ns = candidates[0][0], None
        for plan, enqueue in candidates[:count]:
            for event in enqueue():  # untimed: a first run may build the kernel
                event.wait()
            for _ in range(repeats):
                events = enqueue()
                for event in events:
                    event.wait()
                elapsed = sum(e.profile.end - e.profile.start for e in events)
                self.timed += 1
                if best_ns is None or elapsed < best_ns:
                    best, best_ns = plan, elapsed
        with self._lock:
            self.entries[(*device_identity(device), name + PLAN, key)] = best
            self._changed = True
        logger.debug("tuned %s over %s: plan %s (%s ns)", name, key, best, best_ns)
        return best

    def local_size(self, device: Any, name: str, n: int) -> int | None:
        """The tuned 1-D local size of kernel ``name`` over ``n`` work-items, or None."""
        found = self.entries.get((*device_identity(device), name, (n,)))
        return found[0] if found else None

    def _key(self, kernel: Any, device: Any, n: int) -> TuningKey:
        # Asking OpenCL for names costs microseconds per launch: ask once per kernel and device.
        name = self._names.get(kernel)
        if name is None:
            name = self._names[kernel] = kernel.function_name
        identity = self._identities.get(device.int_ptr)
        if identity is None:
            identity = self._identities[device.int_ptr] = device_identity(device)
        return (*identity, name, (n,))

    def enqueue(self, kernel: Any, queue: Any, device: Any, n: int, args: tuple) -> Any:
        """Enqueue the 1-D ``kernel(*args)`` over ``n`` work-items (the kernel skips those past
        ``n``) on ``queue`` with the tuned local size; on the profiling queue, tune it first
        when it is not known. Returns the event."""
        key = self._key(kernel, device, n)
        found = self.entries.get(key)
        local = found[0] if found else None
        if local is None and self.tunes and queue in self._queues.values():
            local = self._tune(kernel, queue, device, key, args)
        local = local or DEFAULT_LOCAL_SIZE
        try:
            return kernel(queue, (rounded_up(n, local),), (local,), *args)
        except cl.Error as e:
            if found is None:
                raise
            # A kernel may take fewer work-items than its device (check_device's limit).
            problem = f"has a local size kernel {key[2]!r} cannot launch with ({e})"
            raise self._entry_problem(key, found, problem) from e

    def _tune(self, kernel: Any, queue: Any, device: Any, key: TuningKey, args: tuple) -> int:
        (n,) = key[3]
        info = cl.kernel_work_group_info
        largest = kernel.get_work_group_info(info.WORK_GROUP_SIZE, device)
        multiple = kernel.get_work_group_info(info.PREFERRED_WORK_GROUP_SIZE_MULTIPLE, device)
        repeats = {TuningMode.RAPID: 1, TuningMode.NORMAL: 2}.get(self.mode, 3)
        best, best_ns = DEFAULT_LOCAL_SIZE, None
        for local in candidate_sizes(self.mode, largest, multiple):
            # The first run may build the kernel for this work-group size (PoCL does): untimed.
            kernel(queue, (rounded_up(n, local),), (local,), *args).wait()
            for _ in range(repeats):
                event = kernel(queue, (rounded_up(n, local),), (local,), *args)
                event.wait()
                elapsed = event.profile.end - event.profile.start
                self.timed += 1
                if best_ns is None or elapsed < best_ns:
                    best, best_ns = local, elapsed
        with self._lock:
            self.entries[key] = (best,)
            self._changed = True
        logger.debug("tuned %s over %d work-items: local size %d (%s ns)", key[2], n, best, best_ns)
        return best

    def save(self) -> None:
        """Write the tuning file when something new was tuned since it was read or written."""
        with self._lock:
            if self.path is None or not self._changed:
                return
            write_tuning_file(self.path, self.entries)
            self._changed = False
