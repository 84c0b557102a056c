"""Scratch memory for kernels' temporary values: split GEMMs' partial sums, a fold's running result.

A kernel asks its device context for a temporary with ``context.scratch(shape, slot)``. Inside
a queue actor's submission the temporary comes from the :class:`ScratchSet` lent to that
submission: one buffer per slot, grown to the largest request and shared by every kernel of
the submission. That is safe because a submission's commands run in order on one in-order
queue: a later kernel's writes to a slot come after an earlier kernel's reads of it. The set
goes back to the device's :class:`ScratchSets` once the submission's commands have finished.
A run's submissions take its memory pool's own set (a common one while that is lent), so
each run in a pool finds the buffers of the one before, grown to their size: the buffers
its recorded launches name (see ``launches``).

Feeds and outputs cross through the set's pinned staging memory (buffers made with
``ALLOC_HOST_PTR`` and mapped once, NVIDIA's recommended way to copy without waiting): a feed is
copied into staging and uploaded from there; an output is downloaded into staging and copied
into its own array once the submission has finished (``complete``). A copy between the device
and pageable host memory makes NVIDIA's driver hold the enqueueing thread until the queue has
reached that copy — the trio thread would wait out every earlier command on the queue, and no
other run could be enqueued meanwhile.

Making and releasing an OpenCL buffer per launch is dear: on an H100 (NVIDIA's OpenCL driver)
a new buffer costs about 35 µs to create and 60 µs more at its first launch, and releasing one
that queued commands still use about 300 µs — resnet50's twenty im2col buffers (as convolutions had then) cost more host
time than all its GEMM launches. A kernel outside any submission (a workload's blocking
``execute``, the tuner) gets a new buffer per call, as before.
"""

from __future__ import annotations

import contextvars
import threading
import weakref
from typing import Any

import numpy as np

from flowrt.workers.gpu.device import cl

# The set lent to the submission being enqueued (set by the queue actor around ``enqueue``).
current_scratch: contextvars.ContextVar[ScratchSet | None] = contextvars.ContextVar(
    "flowrt_gpu_scratch", default=None
)


def map_pinned(context: Any, queue: Any, nbytes: int) -> np.ndarray:
    """``nbytes`` (at least one) of page-locked host memory as a uint8 array: a buffer made
    with ``ALLOC_HOST_PTR`` and mapped on ``queue`` (idle: the map blocks). The mapping and the
    buffer live as long as the array."""
    flags = cl.mem_flags.READ_WRITE | cl.mem_flags.ALLOC_HOST_PTR
    buffer = cl.Buffer(context, flags, max(nbytes, 1))
    mapped, _ = cl.enqueue_map_buffer(
        queue,
        buffer,
        cl.map_flags.READ | cl.map_flags.WRITE,  # type: ignore[arg-type]  # pyopencl's stubs: OR-ed flags are ints
        0,
        (max(nbytes, 1),),
        np.dtype(np.uint8),
    )
    return mapped


class ScratchSet:
    """One buffer per slot, for the kernels of one submission at a time."""

    def __init__(self, context: Any, map_queue: Any) -> None:
        self.context = context  # the cl.Context its buffers belong to
        self.map_queue = map_queue  # an idle queue to map staging buffers on
        self.buffers: dict[int, Any] = {}
        self.staging: list[np.ndarray] = []  # mapped pinned host memory, uint8
        self.staged = 0  # staging areas used by the submission so far
        self.copies: list[tuple[np.ndarray, np.ndarray]] = []  # (to, from) after completion
        # Buffers outgrown during a submission: its queued commands may still use them, so
        # they are kept until it has finished.
        self.retired: list[Any] = []

    def take(self, nbytes: int, slot: int) -> Any:
        """Slot ``slot``'s buffer, of at least ``nbytes`` bytes."""
        buffer = self.buffers.get(slot)
        if buffer is None or buffer.size < nbytes:
            if buffer is not None:
                self.retired.append(buffer)
            buffer = self.buffers[slot] = cl.Buffer(self.context, cl.mem_flags.READ_WRITE, max(nbytes, 1))
        return buffer

    def stage(self, nbytes: int) -> np.ndarray:
        """A staging area of ``nbytes`` bytes of pinned host memory (uint8), the submission's
        next one: each transfer of a submission has its own."""
        index, self.staged = self.staged, self.staged + 1
        if index == len(self.staging):
            self.staging.append(self._pinned(nbytes))
        elif self.staging[index].nbytes < nbytes:
            self.retired.append(self.staging[index])
            self.staging[index] = self._pinned(nbytes)
        return self.staging[index][:nbytes]

    def _pinned(self, nbytes: int) -> np.ndarray:
        return map_pinned(self.context, self.map_queue, nbytes)

    def copy_after(self, target: np.ndarray, staged: np.ndarray) -> None:
        """Copy ``staged`` into ``target`` once the submission's commands have finished."""
        self.copies.append((target, staged))

    def complete(self) -> None:
        """The submission's commands have finished: deliver its downloads, reset for the next."""
        for target, staged in self.copies:
            np.copyto(target, staged)
        self.copies.clear()
        self.retired.clear()
        self.staged = 0


class ScratchSets:
    """A device's scratch sets: one of its own for each owner that asks (a run's memory pool:
    its runs then find the same buffers each time, which recorded launches name, see
    ``launches``), and a common stock for the rest."""

    def __init__(self, context: Any, map_queue: Any) -> None:
        self.context = context
        self.map_queue = map_queue
        self._free: list[ScratchSet] = []
        self._owned: weakref.WeakKeyDictionary[Any, ScratchSet] = weakref.WeakKeyDictionary()
        self._lent: set[int] = set()  # ids of the owned sets lent now
        self._lock = threading.Lock()

    def take(self, owner: Any = None) -> ScratchSet:
        """``owner``'s own set (made at its first submission, freed with it), unless lent to
        another submission of the owner's now; else a set of the common stock."""
        with self._lock:
            if owner is not None:
                owned = self._owned.get(owner)
                if owned is None:
                    owned = self._owned[owner] = ScratchSet(self.context, self.map_queue)
                if id(owned) not in self._lent:
                    self._lent.add(id(owned))
                    return owned
            if self._free:
                return self._free.pop()
        return ScratchSet(self.context, self.map_queue)

    def give(self, scratch: ScratchSet) -> None:
        """Return a set whose submission's commands have all finished."""
        scratch.complete()
        with self._lock:
            if id(scratch) in self._lent:
                self._lent.discard(id(scratch))
            else:
                self._free.append(scratch)
