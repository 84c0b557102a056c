"""The conflict relation of planned tensors, computed in one sweep instead of pair by pair.

Comparing every pair of tensors costs n² Python steps: minutes for a chain of 20,000
layers. Here the schedule is swept once backwards, keeping for each step ``u`` the bit mask
``descendants[u]`` of the tensors all of whose writers run strictly after ``u``. A tensor
``a`` is dead before ``b`` exactly when every use of ``a`` is in that mask's sense before
``b``, so the tensors ``a`` is dead before are the AND of ``descendants[u]`` over its uses:
a few big-integer operations (done in C) per step instead of one Python step per pair.

No tensor is dead before one produced at the same or an earlier step, so the pairs are
decided looking forward only (to tensors produced later) and mirrored.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from flowrt.engine.memory.lifetime import TensorLifetime


def set_bits(mask: int) -> list[int]:
    """Positions of the set bits of ``mask`` (>= 0), in increasing order."""
    if mask.bit_count() <= 8:
        bits = []
        while mask:
            low = mask & -mask
            bits.append(low.bit_length() - 1)
            mask ^= low
        return bits
    raw = np.frombuffer(mask.to_bytes((mask.bit_length() + 7) // 8, "little"), np.uint8)
    return np.flatnonzero(np.unpackbits(raw, bitorder="little")).tolist()


def conflict_masks(
    tensors: Sequence[TensorLifetime],
    before: Sequence[int],
    children: Sequence[Sequence[int]],
) -> list[int]:
    """For each tensor (by position), the mask of the tensors that conflict with it.

    ``before[i]``: the steps that happen before every write of tensor ``i``; ``children[s]``:
    the steps that read what step ``s`` writes (the dependency edges of the schedule).
    """
    forward = _forward_conflicts(tensors, before, children)
    masks = list(forward)
    back: list[list[int]] = [[] for _ in tensors]
    for i, mask in enumerate(forward):
        for j in set_bits(mask):
            back[j].append(i)
    for j, earlier in enumerate(back):
        for i in earlier:
            masks[j] |= 1 << i
    return masks


def _forward_conflicts(
    tensors: Sequence[TensorLifetime], before: Sequence[int], children: Sequence[Sequence[int]]
) -> list[int]:
    """Per tensor: the tensors produced after it (later step, or same step and later
    position) that it is not dead before, found in one backward sweep of the schedule."""
    num_steps = len(children)
    uses = [sorted({t.producer, *t.readers, *t.part_producers}) for t in tensors]
    produced_at: list[list[int]] = [[] for _ in range(num_steps)]
    decided_at: list[list[int]] = [[] for _ in range(num_steps)]  # at the tensor's first use
    single = [0] * num_steps  # per step: the tensors it alone writes
    several = [0] * num_steps  # per step u: the tensors of several writers, all after u
    for i, t in enumerate(tensors):
        produced_at[t.producer].append(i)
        decided_at[uses[i][0]].append(i)
        if t.part_producers:
            for u in set_bits(before[i]):
                several[u] |= 1 << i
        else:
            single[t.producer] |= 1 << i
    drop = _last_needs(uses, children)
    descendants: dict[int, int] = {}
    later: dict[int, int] = {}
    seen = 0
    forward = [0] * len(tensors)
    for s in range(num_steps - 1, -1, -1):
        mask = several[s]
        for c in children[s]:
            mask |= single[c] | descendants[c]
        descendants[s] = mask
        for i in reversed(produced_at[s]):
            later[i] = seen
            seen |= 1 << i
        for i in decided_at[s]:
            after = 0  # the tensors ``i`` is dead before
            if not tensors[i].pinned:
                after = ~0
                for u in uses[i]:
                    after &= descendants[u]
            forward[i] = later.pop(i) & ~after
        for u in drop[s]:
            del descendants[u]  # keeps memory to the steps still needed (a window, in a chain)
    return forward


def _last_needs(uses: Sequence[Sequence[int]], children: Sequence[Sequence[int]]) -> list[list[int]]:
    """Per step ``s``: the steps whose descendant masks no step before ``s`` needs (their
    parents and the first uses of the tensors they use all come at ``s`` or later)."""
    last_need = list(range(len(children)))
    for s, kids in enumerate(children):
        for c in kids:
            last_need[c] = min(last_need[c], s)
    for steps in uses:
        for u in steps:
            last_need[u] = min(last_need[u], steps[0])
    drop: list[list[int]] = [[] for _ in children]
    for u, s in enumerate(last_need):
        drop[s].append(u)
    return drop
