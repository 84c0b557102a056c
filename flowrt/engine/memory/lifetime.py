"""Lifetime analysis: which intermediate tensors may share bytes, given concurrent execution.

Two tensors may share bytes only when one is dead before the other is born *in every
execution*: every reader of the first (and its producer) must happen-before the producer of
the second. Happens-before is the dataflow's dependency order, so tensors of branches that
run concurrently never share. Views (Reshape, Flatten, ...) own no bytes: they extend the
lifetime of the tensor they alias. Parts (the inputs of a Concat written straight into their
region of its output, the Compute Library's sub-tensors) own no bytes either: the whole
tensor is live from the first write of any part, so it has several producers.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import attrs


@attrs.frozen
class Step:
    """One workload in the schedule: the tensors it reads and writes."""

    reads: tuple[int, ...]
    writes: tuple[int, ...]


@attrs.frozen
class TensorLifetime:
    """An intermediate tensor that needs bytes: its size, producer, last readers, order span."""

    tensor: int
    nbytes: int
    producer: int
    readers: tuple[int, ...]
    first: int
    last: int
    pinned: bool  # lives until the run ends (a network output)
    part_producers: tuple[int, ...] = ()  # steps that write parts of it (sub-tensors)


class Lifetimes:
    """Lifetimes of the planned tensors and the may-share relation between them.

    "Dead before" is a strict partial order on tensors; two tensors *conflict* (may be live
    at the same moment of some execution) when neither is dead before the other.
    """

    def __init__(self, tensors: list[TensorLifetime], ancestors: list[int], num_steps: int) -> None:
        self.tensors = tensors
        self._ancestors = ancestors
        self.num_steps = num_steps
        self._index = {t.tensor: i for i, t in enumerate(tensors)}
        self._uses = [
            0 if t.pinned else sum(1 << s for s in {t.producer, *t.readers, *t.part_producers})
            for t in tensors
        ]
        # Steps that happen before every write of a tensor (its own and its parts').
        self._before = []
        for t in tensors:
            mask = ancestors[t.producer]
            for p in t.part_producers:
                mask &= ancestors[p]
            self._before.append(mask)
        self._conflicts: list[int] | None = None

    def dead_before(self, earlier: TensorLifetime, later: TensorLifetime) -> bool:
        """True when ``earlier`` is dead before ``later`` is written, in every execution."""
        if earlier.pinned:
            return False
        uses = self._uses[self._index[earlier.tensor]]
        return uses & ~self._before[self._index[later.tensor]] == 0

    def may_share(self, a: TensorLifetime, b: TensorLifetime) -> bool:
        return not self.conflicts_with(a) >> self._index[b.tensor] & 1

    def conflicts_with(self, tensor: TensorLifetime) -> int:
        """Bit mask (by position in ``tensors``) of the tensors that conflict with ``tensor``."""
        if self._conflicts is None:
            self._conflicts = self._conflict_masks()
        return self._conflicts[self._index[tensor.tensor]]

    def _conflict_masks(self) -> list[int]:
        masks = [0] * len(self.tensors)
        for i, a in enumerate(self.tensors):
            for j in range(i + 1, len(self.tensors)):
                b = self.tensors[j]
                if not (self.dead_before(a, b) or self.dead_before(b, a)):
                    masks[i] |= 1 << j
                    masks[j] |= 1 << i
        return masks

    def lower_bound_bytes(self) -> int:
        """The largest total of tensors that can be live at one moment: no packing that keeps
        conflicting tensors apart can use fewer bytes.

        Each step's live set (in the topological schedule) is a set of pairwise-conflicting
        tensors; it is grown greedily, largest first, with tensors that conflict with all of
        it (those of branches that may run concurrently). The heaviest such set is returned.
        """
        if not self.tensors:
            return 0
        by_size = sorted(range(len(self.tensors)), key=lambda i: -self.tensors[i].nbytes)
        best = 0
        for step in range(self.num_steps):
            members = [
                i for i, t in enumerate(self.tensors) if t.first <= step and (t.pinned or step <= t.last)
            ]
            candidates = ~0
            for i in members:
                candidates &= self.conflicts_with(self.tensors[i])
            total = sum(self.tensors[i].nbytes for i in members)
            for i in by_size:
                if candidates >> i & 1:
                    total += self.tensors[i].nbytes
                    candidates &= self.conflicts_with(self.tensors[i])
            best = max(best, total)
        return best

    def no_reuse_bytes(self) -> int:
        return sum(t.nbytes for t in self.tensors)


def analyze(
    steps: Sequence[Step],
    sizes: Mapping[int, int],
    pinned: set[int],
    aliases: Mapping[int, int],
    parts: Mapping[int, int] | None = None,
) -> Lifetimes:
    """Lifetimes of the tensors in ``sizes`` over ``steps`` (given in a topological order).

    ``aliases`` maps a view tensor to the tensor whose bytes it reads, ``parts`` a sub-tensor
    to the tensor it is a region of; ``pinned`` tensors (network outputs) stay live until the
    run ends.
    """
    parts = parts or {}

    def root(tid: int) -> int:
        while True:
            if tid in aliases:
                tid = aliases[tid]
            elif tid in parts:
                tid = parts[tid]
            else:
                return tid

    part_producers: dict[int, list[int]] = {}

    producer: dict[int, int] = {}
    readers: dict[int, list[int]] = {}
    ancestors: list[int] = []
    for index, step in enumerate(steps):
        before = 0
        for tid in step.reads:
            if tid in producer:
                p = producer[tid]
                before |= ancestors[p] | (1 << p)
            readers.setdefault(root(tid), []).append(index)
        ancestors.append(before)
        for tid in step.writes:
            producer[tid] = index
            if tid in parts:
                part_producers.setdefault(root(tid), []).append(index)
    roots_pinned = {root(t) for t in pinned}
    tensors = []
    for tid, nbytes in sizes.items():
        if tid not in producer:
            continue
        reads = tuple(readers.get(tid, ()))
        writes = tuple(part_producers.get(tid, ()))
        first = min((producer[tid], *writes))
        tensors.append(
            TensorLifetime(
                tid,
                nbytes,
                producer[tid],
                reads,
                first,
                max(reads, default=producer[tid]),
                tid in roots_pinned,
                writes,
            )
        )
    return Lifetimes(tensors, ancestors, len(steps))
