"""Memory pools lent to runs: a PoolManager holds N pools; a run awaits one and gives it back.

A pool is one arena per backend, its bytes allocated once: at load for the first
``EAGER_POOLS`` pools (``EAGER_DEVICE_POOLS`` for a network with layers on a device), the
others when runs in flight at once first need them (runs one after another use one pool,
and a process holds the host memory of one). Waiting runs are served
by priority, first-in first-out within a priority. Release is structural: ``async with
manager.acquire(priority) as pool`` gives the pool back on success, error and cancellation.

Aging: a waiting run gains one priority level for every ``aging_interval`` seconds it has
waited (never beyond the highest), so a LOW run competes as HIGH after two intervals and is
then served in arrival order: low priority is never starved. The rule, and the waiting, are
``PriorityLender``'s, which lends the CPU workers the same way.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from typing import Any

import numpy as np

from flowrt.engine.memory.allocator import Allocator, HostAllocator
from flowrt.engine.memory.lending import PriorityLender
from flowrt.errors import ResourceError

# Pools a PoolManager allocates when it is made; it makes any more on demand (see its doc):
# one, which is all that runs one after another use (a second, made at load, cost resnet50's
# process 9 MiB of peak RSS and vgg19's 31 that no run touched). A network with layers on a
# device has up to EAGER_DEVICE_POOLS made at load: device memory is no RSS, and allocating
# it (arenas, pinned staging) in the run that first needs it cost that run tens of ms.
EAGER_POOLS = 1
EAGER_DEVICE_POOLS = 64


class MemoryPool:
    """One arena per backend; what one run binds its intermediate tensors to.

    Each arena is viewed and zeroed by the allocator that made it, so a device arena (one
    OpenCL buffer) hands out device tensors at offsets, a host arena numpy views.
    """

    def __init__(
        self, index: int, arenas: Mapping[str, Any], allocators: Mapping[str, Allocator] | None = None
    ) -> None:
        self.index = index
        self.arenas = dict(arenas)
        allocators = allocators or {}
        # Allocators that only allocate (the protocol's minimum) make host arenas.
        self._viewers = {b: getattr(allocators.get(b), "view", HostAllocator.view) for b in self.arenas}
        self._zeroers = {b: getattr(allocators.get(b), "zero", HostAllocator.zero) for b in self.arenas}
        # Views are made once per pool: every run that borrows it binds the same tensors.
        self._views: dict[tuple, Any] = {}
        # The executor's record of each workload's output views in this pool (by layer), and
        # of each host segment's steps with their workloads bound to this pool's memory.
        self.placements: dict[str, Any] = {}
        self.programs: dict[Any, Any] = {}  # by segment index (and the layers writing caller arrays)
        self.ran: set[int] = set()  # segments run once in this pool (programs are made after)

    def view(self, backend: str, offset: int, shape: tuple[int, ...], dtype: np.dtype) -> Any:
        """The tensor of ``shape``/``dtype`` stored at ``offset`` of ``backend``'s arena (made
        once, then the same object each time: do not change its shape or strides in place)."""
        key = (backend, offset, shape, dtype)
        view = self._views.get(key)
        if view is None:
            view = self._views[key] = self._viewers[backend](self.arenas[backend], offset, shape, dtype)
        return view

    def zero(self) -> None:
        for backend, arena in self.arenas.items():
            self._zeroers[backend](arena)

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in self.arenas.values())


class PoolManager(PriorityLender[MemoryPool]):
    """Holds ``count`` pools of the given per-backend arena sizes and lends them to runs
    (by priority, with aging: see ``flowrt.engine.memory.lending``).

    The first ``eager`` pools are allocated here (at load); a manager of more makes
    each further one when a run first finds every pool made lent, so that a huge ``count``
    costs only the pools that runs in flight at once use. ``pools`` lists those made.
    """

    def __init__(
        self,
        count: int,
        arena_bytes: Mapping[str, int],
        allocators: Mapping[str, Allocator],
        *,
        zero_on_release: bool = False,
        aging_interval: float = 1.0,
        eager: int = EAGER_POOLS,
    ) -> None:
        self.count = count
        self._arena_bytes = dict(arena_bytes)
        self._allocators = allocators
        self.pools: list[MemoryPool] = []
        super().__init__([self._make_pool() for _ in range(min(count, eager))], aging_interval=aging_interval)
        self.zero_on_release = zero_on_release

    def _make_pool(self) -> MemoryPool:
        try:
            arenas = {b: self._allocators[b].allocate(n) for b, n in self._arena_bytes.items()}
        except MemoryError as e:  # within the memory budget, which load checked, yet refused
            detail = ", ".join(f"{b} {n:,} bytes" for b, n in self._arena_bytes.items())
            raise ResourceError(
                f"out of memory allocating memory pool {len(self.pools)} of {self.count} ({detail}): {e}"
            ) from e
        self.pools.append(MemoryPool(len(self.pools), arenas, self._allocators))
        return self.pools[-1]

    def _more(self) -> MemoryPool | None:
        return self._make_pool() if len(self.pools) < self.count else None

    @property
    def free_count(self) -> int:
        """Pools not lent now, those not made yet included."""
        return super().free_count + self.count - len(self.pools)

    @property
    def nbytes(self) -> int:
        """The arena bytes of all ``count`` pools, made or not: what the memory budget holds."""
        return self.count * sum(self._arena_bytes.values())

    @asynccontextmanager
    async def acquire(self, priority: int = 1) -> AsyncIterator[MemoryPool]:
        """Lend a pool for the body of the ``async with``; waits while all are lent."""
        pool = await self.take(priority)
        try:
            yield pool
        finally:
            self.give_back(pool)

    def give_back(self, pool: MemoryPool) -> None:
        """Return a pool (zeroed first when ``zero_on_release``) to the next waiting run."""
        if self.zero_on_release:
            pool.zero()
        super().give_back(pool)
