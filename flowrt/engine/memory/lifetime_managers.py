"""Turning lifetimes into a memory plan: offsets in one arena, or reuse classes (blobs).

OffsetLifetimeManager and BlobLifetimeManager, as the Compute Library's managers of the same
names: the first packs every tensor at an aligned offset of one arena per backend; the second
groups tensors into blobs (one buffer per reuse class).
"""

from __future__ import annotations

import attrs

from flowrt.engine.memory.allocator import align_up
from flowrt.engine.memory.conflicts import set_bits
from flowrt.engine.memory.lifetime import Lifetimes, TensorLifetime


@attrs.frozen
class Placement:
    """Where a tensor lives: byte offset and size inside its backend's arena."""

    offset: int
    nbytes: int


@attrs.frozen
class MemoryPlan:
    """Placements of every planned tensor and the arena size they need."""

    placements: dict[int, Placement]
    arena_bytes: int


# Orders the offset packer tries; it keeps the smallest arena (ties: the first order).
_ORDERS = (
    lambda t: (-t.nbytes, t.first),  # greedy by size, as TFLite's arena planner
    lambda t: (-(t.last - t.first + 1) * t.nbytes, t.first),  # by area in the schedule
    lambda t: (t.first, -t.nbytes),  # in schedule order
)


class OffsetLifetimeManager:
    """Greedy packing: tensors in a chosen order, each at the lowest aligned offset that no
    conflicting (possibly simultaneously live) tensor already occupies. A few orders are tried
    and the smallest arena kept."""

    def __init__(self, alignment: int = 64) -> None:
        self.alignment = alignment

    def plan(self, lifetimes: Lifetimes) -> MemoryPlan:
        plans = [self._pack(lifetimes, sorted(lifetimes.tensors, key=order)) for order in _ORDERS]
        return min(plans, key=lambda p: p.arena_bytes)

    def _pack(self, lifetimes: Lifetimes, order: list[TensorLifetime]) -> MemoryPlan:
        position = {t.tensor: i for i, t in enumerate(lifetimes.tensors)}
        spans: dict[int, tuple[int, int]] = {}  # position -> (offset, end) of the placed
        placed_mask = 0
        placements: dict[int, Placement] = {}
        arena = 0
        for tensor in order:
            size = align_up(max(tensor.nbytes, 1), self.alignment)
            # Only the placed tensors that conflict with this one are looked at.
            taken = sorted(spans[p] for p in set_bits(lifetimes.conflicts_with(tensor) & placed_mask))
            offset = 0
            for start, end in taken:
                if offset + size <= start:
                    break
                offset = max(offset, end)
            here = position[tensor.tensor]
            spans[here] = (offset, offset + size)
            placed_mask |= 1 << here
            placements[tensor.tensor] = Placement(offset, tensor.nbytes)
            arena = max(arena, offset + size)
        return MemoryPlan(placements, arena)


class BlobLifetimeManager:
    """Reuse classes: each tensor joins a blob whose tensors are all dead before it (the one
    closest in size), else opens a new blob; blobs are laid end to end in the arena."""

    def __init__(self, alignment: int = 64) -> None:
        self.alignment = alignment

    def plan(self, lifetimes: Lifetimes) -> MemoryPlan:
        sizes: list[int] = []  # per blob: its largest tensor
        # Per blob: the steps that use any of its tensors, or -1 when one is pinned (then it is
        # never dead before anything): a blob is free for a tensor when all of them come first.
        used: list[int] = []
        assignment: dict[int, int] = {}
        for tensor in sorted(lifetimes.tensors, key=lambda t: t.first):
            before = lifetimes.before_mask(tensor)
            free = [i for i, steps in enumerate(used) if steps >= 0 and steps & ~before == 0]
            if free:
                fits = [i for i in free if sizes[i] >= tensor.nbytes]
                i = min(fits, key=sizes.__getitem__) if fits else max(free, key=sizes.__getitem__)
                sizes[i] = max(sizes[i], tensor.nbytes)
            else:
                i = len(sizes)
                sizes.append(tensor.nbytes)
                used.append(0)
            uses = lifetimes.uses_mask(tensor)
            used[i] = -1 if used[i] < 0 or uses is None else used[i] | uses
            assignment[tensor.tensor] = i
        offsets, arena = [], 0
        for size in sizes:
            offsets.append(arena)
            arena += align_up(max(size, 1), self.alignment)
        placements = {t.tensor: Placement(offsets[assignment[t.tensor]], t.nbytes) for t in lifetimes.tensors}
        return MemoryPlan(placements, arena)
