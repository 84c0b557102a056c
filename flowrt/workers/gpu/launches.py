"""A GpuAcc layer's kernel launches recorded once per memory pool, then enqueued as they are.

A launch through a kernel's ``enqueue`` costs host time before the device sees it: the
layer's Python (shapes, strides and activation codes turned into arguments) and pyopencl
setting every argument again (``clSetKernelArg`` per argument) before ``clEnqueueNDRangeKernel``.
On an H100 that was about 55 us a launch, and a resnet50 run was mostly host time. But in a
memory pool nothing moves: a layer's inputs and outputs are the pool's buffers, its weights
its own, its temporaries the pool's scratch set (see ``scratch``), so every run in the pool
makes the same launches with the same arguments. So the executor records them once (the
pool's second run of a segment, when the scratch buffers have grown to their size), each in
a kernel object of its own with its arguments set, and later runs only enqueue those
(``clEnqueueNDRangeKernel`` alone, called directly: see ``direct_enqueue``).

A queue actor may cut a submission into chunks (see ``queues``): while one is enqueued it
sets ``current_room`` to how many more commands go into the chunk, and the launches yield
once per that many (the number they enqueued), not once per launch.

Only launches are recorded: a workload that enqueues anything else while recording (a copy,
an upload) calls :func:`refuse` and stays a step of its own, as does one reading a feed (its
upload buffer changes from run to run) or a value on the host that is not a constant.

``FLOWRT_GPU_RECORD_LAUNCHES=0`` in the environment turns recording off for the process
(every launch goes through its layer's code), to rule it out when a result looks wrong.
"""

from __future__ import annotations

import contextvars
import os
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import numpy as np

from flowrt.workers.gpu import direct_enqueue
from flowrt.workers.gpu.device import cl
from flowrt.workers.gpu.scratch import current_scratch

ENV = "FLOWRT_GPU_RECORD_LAUNCHES"


def enabled() -> bool:
    """Whether launches are recorded (unless the environment says ``0``)."""
    return os.environ.get(ENV, "1").strip() != "0"


# Kernel launches this process has enqueued on GpuAcc's queues (a profiled run reads it
# around each workload: ``GpuBackendContext.launched``).
LAUNCHED = [0]


class Recording:
    """The launches one workload makes while it is recorded: (kernel, global size, local
    size, arguments); ``refused`` says why they cannot stand for it, if they cannot."""

    def __init__(self) -> None:
        self.launches: list[tuple[Any, Any, Any, tuple]] = []
        self.refused: str | None = None


current_recording: contextvars.ContextVar[Recording | None] = contextvars.ContextVar(
    "flowrt_gpu_recording", default=None
)


@contextmanager
def recording() -> Iterator[Recording]:
    """Record the launches made inside the block (on this thread)."""
    record = Recording()
    token = current_recording.set(record)
    try:
        yield record
    finally:
        current_recording.reset(token)


def refuse(reason: str) -> None:
    """A command other than a launch is being enqueued: a recording under way cannot stand
    for the workload."""
    record = current_recording.get()
    if record is not None and record.refused is None:
        record.refused = reason


class Room:
    """How many more commands the chunk being enqueued takes (None: no limit)."""

    __slots__ = ("commands",)

    def __init__(self) -> None:
        self.commands: int | None = None


current_room: contextvars.ContextVar[Room | None] = contextvars.ContextVar("flowrt_gpu_room", default=None)


class BoundLaunches:
    """A workload's recorded launches, each a kernel object of its own with its arguments
    set; valid with the scratch set they were recorded with (``scratch``)."""

    __slots__ = ("_direct", "_keep", "launches", "scratch")

    def __init__(self, launches: list[tuple[Any, Any, Any]], scratch: Any, keep: list[tuple]) -> None:
        self.launches = launches
        self.scratch = scratch
        self._keep = keep  # the arguments' buffers, alive as long as the kernels that name them
        self._direct = direct_enqueue.DirectLaunches(launches) if direct_enqueue.available() else None

    def ready(self) -> bool:
        """Whether the submission being enqueued has the scratch set the launches name (not
        when its pool's set was lent elsewhere)."""
        return current_scratch.get() is self.scratch

    def enqueue(self, queue: Any) -> bool:
        """Enqueue the launches on ``queue``; False (nothing enqueued) unless ``ready``."""
        if current_scratch.get() is not self.scratch:
            return False
        self.enqueue_range(queue, 0, len(self.launches))
        return True

    def enqueue_each(self, queue: Any) -> Iterator[int]:
        """Enqueue the launches on ``queue`` (the caller checked ``ready``), as many at a time
        as ``current_room`` takes, yielding how many after each."""
        room, total, done = current_room.get(), len(self.launches), 0
        while done < total:
            take = room.commands if room is not None and room.commands is not None else total
            stop = min(total, done + max(1, take))
            self.enqueue_range(queue, done, stop)
            yield stop - done
            done = stop

    def enqueue_range(self, queue: Any, start: int, stop: int) -> None:
        """Enqueue launches ``start`` to ``stop`` on ``queue``."""
        if self._direct is not None:
            self._direct.enqueue(queue, start, stop)
        else:
            enqueue = cl.enqueue_nd_range_kernel
            for kernel, global_size, local_size in self.launches[start:stop]:
                enqueue(queue, kernel, global_size, local_size)
        LAUNCHED[0] += stop - start

    @classmethod
    def chain(cls, parts: Sequence[BoundLaunches]) -> BoundLaunches | None:
        """The launches of ``parts`` in order, as one (None unless all name one scratch set)."""
        if not parts or any(p.scratch is not parts[0].scratch for p in parts):
            return None
        launches = [launch for part in parts for launch in part.launches]
        return cls(launches, parts[0].scratch, [kept for part in parts for kept in part._keep])


def bind(record: Recording, scratch: Any) -> BoundLaunches | None:
    """The launches of ``record`` bound to new kernel objects, or None when it was refused
    or made none."""
    if record.refused is not None or not record.launches:
        return None
    launches = []
    for kernel, global_size, local_size, args in record.launches:
        bound = cl.Kernel(kernel.program, kernel.function_name)
        bound.set_scalar_arg_dtypes([a.dtype if isinstance(a, np.generic) else None for a in args])
        bound.set_args(*args)
        launches.append((bound, global_size, local_size))
    return BoundLaunches(launches, scratch, [args for *_, args in record.launches])
