"""Turning lifetimes into a memory plan: offsets in one arena, or reuse classes (blobs).

OffsetLifetimeManager and BlobLifetimeManager, as the Compute Library's managers of the same
names: the first packs every tensor at an aligned offset of one arena per backend; the second
groups tensors into blobs (one buffer per reuse class).
"""

from __future__ import annotations

import attrs

from flowrt.engine.memory.allocator import align_up
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
        placed: list[tuple[int, TensorLifetime, int]] = []
        position = {t.tensor: i for i, t in enumerate(lifetimes.tensors)}
        placements: dict[int, Placement] = {}
        arena = 0
        for tensor in order:
            size = align_up(max(tensor.nbytes, 1), self.alignment)
            conflicts = lifetimes.conflicts_with(tensor)
            taken = sorted(
                (offset, offset + align_up(max(other.nbytes, 1), self.alignment))
                for position, other, offset in placed
                if conflicts >> position & 1
            )
            offset = 0
            for start, end in taken:
                if offset + size <= start:
                    break
                offset = max(offset, end)
            placed.append((position[tensor.tensor], tensor, offset))
            placements[tensor.tensor] = Placement(offset, tensor.nbytes)
            arena = max(arena, offset + size)
        return MemoryPlan(placements, arena)


class BlobLifetimeManager:
    """Reuse classes: each tensor joins a blob whose tensors are all dead before it (the one
    closest in size), else opens a new blob; blobs are laid end to end in the arena."""

    def __init__(self, alignment: int = 64) -> None:
        self.alignment = alignment

    def plan(self, lifetimes: Lifetimes) -> MemoryPlan:
        blobs: list[tuple[list[TensorLifetime], list[int]]] = []  # (members, [size])
        assignment: dict[int, int] = {}
        for tensor in sorted(lifetimes.tensors, key=lambda t: t.first):
            free = [
                i
                for i, (members, _) in enumerate(blobs)
                if all(lifetimes.dead_before(m, tensor) for m in members)
            ]
            if free:
                fits = [i for i in free if blobs[i][1][0] >= tensor.nbytes]
                i = (
                    min(fits, key=lambda k: blobs[k][1][0])
                    if fits
                    else max(free, key=lambda k: blobs[k][1][0])
                )
                blobs[i][0].append(tensor)
                blobs[i][1][0] = max(blobs[i][1][0], tensor.nbytes)
            else:
                i = len(blobs)
                blobs.append(([tensor], [tensor.nbytes]))
            assignment[tensor.tensor] = i
        offsets, arena = [], 0
        for _, size in blobs:
            offsets.append(arena)
            arena += align_up(max(size[0], 1), self.alignment)
        placements = {t.tensor: Placement(offsets[assignment[t.tensor]], t.nbytes) for t in lifetimes.tensors}
        return MemoryPlan(placements, arena)
