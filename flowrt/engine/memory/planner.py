"""Planning a loaded network's memory: which tensors live where in each backend's arena."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import attrs

from flowrt.engine.memory.lifetime import Step, analyze
from flowrt.engine.memory.lifetime_managers import MemoryPlan
from flowrt.engine.memory.manager import MemoryManager
from flowrt.types import TensorInfo

# Layer kinds whose output is a view of their first input: they own no bytes.
VIEW_KINDS = frozenset({"Reshape", "Flatten", "Squeeze", "Unsqueeze"})


@attrs.frozen
class BackendMemory:
    """One backend's figures: its arena and what it would take without reuse."""

    arena_bytes: int
    no_reuse_bytes: int
    lower_bound_bytes: int
    tensors: int


@attrs.frozen
class MemoryLayout:
    """Per backend: the plan (offsets) and the figures; plus tensors left unplanned."""

    plans: dict[str, MemoryPlan]
    report: dict[str, BackendMemory]
    dynamic_tensors: int


@attrs.frozen
class PlannedNode:
    """What the planner needs of one workload, in topological order."""

    kind: str
    backend: str
    reads: tuple[int, ...]
    writes: tuple[int, ...]


def plan_memory(
    order: Sequence[PlannedNode],
    infos: Mapping[int, TensorInfo],
    pinned: set[int],
    managers: Mapping[str, MemoryManager],
) -> MemoryLayout:
    """Plan every workload-produced tensor with a static shape; the rest stay dynamic."""
    steps = [Step(n.reads, n.writes) for n in order]
    aliases: dict[int, int] = {}
    owner: dict[int, str] = {}
    produced = {t for n in order for t in n.writes}
    for node in order:
        if node.kind in VIEW_KINDS and node.reads and node.reads[0] in produced:
            aliases.update({t: node.reads[0] for t in node.writes})
        else:
            owner.update({t: node.backend for t in node.writes})
    dynamic = 0
    per_backend: dict[str, dict[int, int]] = {b: {} for b in dict.fromkeys(n.backend for n in order)}
    for tid, backend in owner.items():
        info = infos.get(tid)
        if info is None or info.num_bytes is None:
            dynamic += 1
            continue
        per_backend[backend][tid] = info.num_bytes
    plans, report = {}, {}
    for backend, sizes in per_backend.items():
        lifetimes = analyze(steps, sizes, pinned, aliases)
        plan = managers[backend].lifetime_manager.plan(lifetimes)
        plans[backend] = plan
        report[backend] = BackendMemory(
            plan.arena_bytes, lifetimes.no_reuse_bytes(), lifetimes.lower_bound_bytes(), len(sizes)
        )
    return MemoryLayout(plans, report, dynamic)
