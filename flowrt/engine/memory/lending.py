"""Lending interchangeable resources to waiting tasks by priority, with aging.

Memory pools (``PoolManager``) and CPU workers (``CpuWorkerPool``) are lent the same way. A
task that finds one free, with nobody waiting, takes it at once; otherwise it waits, and each
one given back goes to the waiter of the highest priority (the lowest ``Priority`` value),
first come first served within a priority.

Aging: a waiter gains one priority level for every ``aging_interval`` seconds it has waited
(never beyond the highest), so a LOW waiter competes as HIGH after two intervals and, having
waited longest, is then served first: low priority is never starved.

Cancelling a waiter is safe: it leaves the queue, and one handed an item just as it was
cancelled passes it on, so a cancelled waiter never holds anything.

A waiter may ask for the item to be put to use the moment it is lent (``on_lent``, called in
``take`` or in the ``give_back`` that lends it): the CPU workers start a job so, in the same
step of trio as the job before it ends, rather than when the waiting task next runs.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable
from typing import Generic, TypeVar

import trio

T = TypeVar("T")


def aged_priority(priority: int, waited: float, aging_interval: float) -> int:
    """The priority a waiter of ``priority`` competes at after ``waited`` seconds: one level
    higher (one lower in value) per ``aging_interval`` seconds, never beyond the highest (0)."""
    return max(0, priority - int(waited // aging_interval))


class _Waiter(Generic[T]):
    """A task waiting to be lent an item."""

    def __init__(
        self, priority: int, sequence: int, since: float, on_lent: Callable[[T], None] | None
    ) -> None:
        self.priority = priority
        self.sequence = sequence
        self.since = since
        self.on_lent = on_lent
        self.event = trio.Event()
        self.item: T | None = None
        self.used = False  # on_lent was called


class PriorityLender(Generic[T]):
    """Lends ``items`` to waiting tasks: by priority, first come first served within one, with
    aging (see the module doc). Use from one trio run; ``take`` and ``give_back`` in pairs."""

    def __init__(self, items: Iterable[T] = (), *, aging_interval: float = 1.0) -> None:
        if aging_interval <= 0:
            raise ValueError(f"aging_interval must be positive, got {aging_interval}")
        self.aging_interval = aging_interval
        self._free: list[T] = list(items)
        self._waiting: list[_Waiter[T]] = []
        self._sequence = itertools.count()

    @property
    def free_count(self) -> int:
        """Items not lent now."""
        return len(self._free)

    @property
    def waiting_count(self) -> int:
        """Tasks waiting for an item now."""
        return len(self._waiting)

    def take_nowait(self) -> T | None:
        """Borrow a free item at once (when none is free, or others wait for one: None),
        without a checkpoint, so that the caller decides in the same step of trio what to do
        when there is none."""
        if not self._free and not self._waiting:
            self._make_more()
        if self._free and not self._waiting:
            return self._free.pop()
        return None

    def _more(self) -> T | None:
        """A new item, made when one is asked for and none is free; None when no more may be
        made (here: never any; ``PoolManager`` makes its pools so, up to its count)."""
        return None

    def _make_more(self) -> None:
        item = self._more()
        if item is not None:
            self._free.append(item)

    async def take(self, priority: int = 1, on_lent: Callable[[T], None] | None = None) -> T:
        """Borrow an item, waiting while none is free (or others wait before this one);
        ``on_lent(item)``, when given, is called as soon as the item is lent, before this
        returns (see the module doc).

        Always a cancellation point: a caller cancelled before it is served never takes an
        item, nor is ``on_lent`` called for it. One cancelled just as it was served passes the
        item on, unless ``on_lent`` had put it to use: then it keeps it, and the cancellation
        is raised all the same. It lets other tasks run only where it waits: a free item is
        taken at once, and the callers (a run taking its pool, a job its CPU worker) go on to
        wait for their work, which lets them run (a full checkpoint here was a pass through
        trio's scheduler, 4 us, of each run's fixed cost).
        """
        await trio.lowlevel.checkpoint_if_cancelled()
        if not self._free and not self._waiting:
            self._make_more()
        if self._free and not self._waiting:
            item = self._free.pop()
            if on_lent is not None:
                on_lent(item)
            return item
        waiter: _Waiter[T] = _Waiter(priority, next(self._sequence), trio.current_time(), on_lent)
        self._waiting.append(waiter)
        try:
            await waiter.event.wait()
        except BaseException:
            if waiter.item is None:
                self._waiting.remove(waiter)
            elif not waiter.used:  # handed an item just as we were cancelled: pass it on
                self.give_back(waiter.item)
            raise
        assert waiter.item is not None  # give_back sets it before the event
        return waiter.item

    def give_back(self, item: T) -> None:
        """Return a borrowed item (or add a new one): to the first waiter in priority order,
        or to the free items when nobody waits."""
        if not self._waiting:
            self._free.append(item)
            return
        now, interval = trio.current_time(), self.aging_interval
        waiter = min(
            self._waiting, key=lambda w: (aged_priority(w.priority, now - w.since, interval), w.sequence)
        )
        self._waiting.remove(waiter)
        waiter.item = item
        # Not for a waiter cancelled in this step of trio, before its task ran again: that
        # one no longer waits on its event, and passes the item on.
        if waiter.on_lent is not None and waiter.event.statistics().tasks_waiting:
            waiter.on_lent(item)
            waiter.used = True
        waiter.event.set()
