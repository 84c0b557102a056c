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

from flowrt.engine.memory.conflicts import conflict_masks, set_bits


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

    def __init__(
        self,
        tensors: list[TensorLifetime],
        ancestors: list[int],
        num_steps: int,
        children: list[list[int]] | None = None,
    ) -> None:
        self.tensors = tensors
        self._ancestors = ancestors
        self.num_steps = num_steps
        # The schedule's dependency edges; without them, every ancestor is taken as a parent.
        self._children = children if children is not None else _children_of(ancestors)
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

    def uses_mask(self, tensor: TensorLifetime) -> int | None:
        """The steps that write or read ``tensor``; None when it is pinned (never dead)."""
        return None if tensor.pinned else self._uses[self._index[tensor.tensor]]

    def before_mask(self, tensor: TensorLifetime) -> int:
        """The steps that happen before every write of ``tensor``."""
        return self._before[self._index[tensor.tensor]]

    def may_share(self, a: TensorLifetime, b: TensorLifetime) -> bool:
        return not self.conflicts_with(a) >> self._index[b.tensor] & 1

    def conflicts_with(self, tensor: TensorLifetime) -> int:
        """Bit mask (by position in ``tensors``) of the tensors that conflict with ``tensor``."""
        if self._conflicts is None:
            self._conflicts = self._conflict_masks()
        return self._conflicts[self._index[tensor.tensor]]

    def _conflict_masks(self) -> list[int]:
        return conflict_masks(self.tensors, self._before, self._children)

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
        rank = {i: r for r, i in enumerate(by_size)}
        born: list[list[int]] = [[] for _ in range(self.num_steps + 1)]
        dies: list[list[int]] = [[] for _ in range(self.num_steps + 1)]
        for i, t in enumerate(self.tensors):
            if t.pinned or t.first <= t.last:
                born[t.first].append(i)
            if not t.pinned:
                dies[t.last + 1].append(i)
        live: set[int] = set()
        best, alone = 0, None  # alone: the greedy total of a step with nothing live (the same for all)
        for step in range(self.num_steps):
            live.update(born[step])
            live.difference_update(dies[step])
            if not live and alone is not None:
                best = max(best, alone)
                continue
            total = self._greedy_total(live, by_size, rank)
            if not live:
                alone = total
            best = max(best, total)
        return best

    def _greedy_total(self, members: set[int], by_size: list[int], rank: dict[int, int]) -> int:
        """``members``' bytes plus those of the tensors, largest first, that conflict with all
        of them and with each one taken before."""
        candidates = ~0
        for i in members:
            candidates &= self.conflicts_with(self.tensors[i])
        total = sum(self.tensors[i].nbytes for i in members)
        order = by_size if candidates < 0 else sorted(set_bits(candidates), key=rank.__getitem__)
        for i in order:
            if candidates >> i & 1:
                total += self.tensors[i].nbytes
                candidates &= self.conflicts_with(self.tensors[i])
        return total

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
    children: list[list[int]] = [[] for _ in steps]
    for index, step in enumerate(steps):
        before = 0
        for tid in step.reads:
            if tid in producer:
                p = producer[tid]
                before |= ancestors[p] | (1 << p)
                children[p].append(index)
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
    return Lifetimes(tensors, ancestors, len(steps), children)


def _children_of(ancestors: Sequence[int]) -> list[list[int]]:
    """Edges from every ancestor of a step to it (the transitive closure: the same reach)."""
    children: list[list[int]] = [[] for _ in ancestors]
    for step, mask in enumerate(ancestors):
        for parent in set_bits(mask):
            children[parent].append(step)
    return children
