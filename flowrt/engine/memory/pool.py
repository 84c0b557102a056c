"""Memory pools lent to runs: a PoolManager holds N pools; a run awaits one and gives it back.

A pool is one arena per backend (its bytes allocated once, at load). Waiting runs are served
by priority, first-in first-out within a priority. Release is structural: ``async with
manager.acquire(priority) as pool`` gives the pool back on success, error and cancellation.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager

import numpy as np
import trio

from flowrt.engine.memory.allocator import Allocator


class MemoryPool:
    """One arena per backend; what one run binds its intermediate tensors to."""

    def __init__(self, index: int, arenas: Mapping[str, np.ndarray]) -> None:
        self.index = index
        self.arenas = dict(arenas)

    def view(self, backend: str, offset: int, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
        """The tensor of ``shape``/``dtype`` stored at ``offset`` of ``backend``'s arena."""
        nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        return self.arenas[backend][offset : offset + nbytes].view(dtype).reshape(shape)

    def zero(self) -> None:
        for arena in self.arenas.values():
            arena.fill(0)

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in self.arenas.values())


class PoolManager:
    """Holds ``count`` pools of the given per-backend arena sizes and lends them to runs."""

    def __init__(
        self,
        count: int,
        arena_bytes: Mapping[str, int],
        allocators: Mapping[str, Allocator],
        *,
        zero_on_release: bool = False,
    ) -> None:
        self.pools = [
            MemoryPool(i, {b: allocators[b].allocate(n) for b, n in arena_bytes.items()})
            for i in range(count)
        ]
        self._free = list(self.pools)
        self._waiting: list[tuple[int, int, trio.Event, list[MemoryPool]]] = []
        self._sequence = itertools.count()
        self.zero_on_release = zero_on_release

    @property
    def count(self) -> int:
        return len(self.pools)

    @property
    def free_count(self) -> int:
        return len(self._free)

    @asynccontextmanager
    async def acquire(self, priority: int = 1) -> AsyncIterator[MemoryPool]:
        """Lend a pool for the body of the ``async with``; waits while all are lent."""
        pool = await self._take(priority)
        try:
            yield pool
        finally:
            self._give_back(pool)

    async def _take(self, priority: int) -> MemoryPool:
        await trio.sleep(0)  # a checkpoint: a cancelled caller never takes a pool
        if self._free and not self._waiting:
            return self._free.pop()
        handoff: list[MemoryPool] = []
        entry = (priority, next(self._sequence), trio.Event(), handoff)
        heapq.heappush(self._waiting, entry)
        try:
            await entry[2].wait()
        except BaseException:
            if handoff:  # handed a pool just as we were cancelled: pass it on
                self._give_back(handoff[0])
            else:
                self._waiting.remove(entry)
                heapq.heapify(self._waiting)
            raise
        return handoff[0]

    def _give_back(self, pool: MemoryPool) -> None:
        if self.zero_on_release:
            pool.zero()
        if self._waiting:
            _, _, event, handoff = heapq.heappop(self._waiting)
            handoff.append(pool)
            event.set()
        else:
            self._free.append(pool)
