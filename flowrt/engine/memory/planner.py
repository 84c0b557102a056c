"""Planning a loaded network's memory: which tensors live where in each backend's arena."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import attrs

from flowrt.engine.memory.lifetime import Step, analyze
from flowrt.engine.memory.lifetime_managers import MemoryPlan, Placement
from flowrt.engine.memory.manager import MemoryManager
from flowrt.types import TensorInfo

# Layer kinds whose output is a view of their first input: they own no bytes.
VIEW_KINDS = frozenset({"Reshape", "Flatten", "Squeeze", "Unsqueeze"})


def is_view(node: Any) -> bool:
    """Whether a dataflow's workload node writes a view of its first input: a layer of
    :data:`VIEW_KINDS`, or one whose workload says it is a view at the shapes it was made for
    (``is_view``: GpuAcc's Transpose that moves only axes of size 1)."""
    return node.kind in VIEW_KINDS or bool(getattr(node.workload, "is_view", False))


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
    view: bool = False  # its output is a view of its first input (see is_view)

    @classmethod
    def of(cls, node: Any) -> PlannedNode:
        """What the planner needs of a dataflow's workload node (its ``kind``, ``backend``,
        ``workload``, and ``inputs`` and ``outputs``: tensor ids, None for absent or unread)."""
        return cls(
            node.kind,
            node.backend,
            tuple(t for t in node.inputs if t is not None),
            tuple(t for t in node.outputs if t is not None),
            is_view(node),
        )


def _concat_parts(
    order: Sequence[PlannedNode],
    infos: Mapping[int, TensorInfo],
    pinned: set[int],
    owner: Mapping[int, str],
    managers: Mapping[str, MemoryManager],
) -> dict[int, tuple[int, int]]:
    """``{part: (whole, byte offset)}``: Concat inputs that can be written straight into their
    region of the Concat's output (the Compute Library's sub-tensors).

    A region can be a part when it is one contiguous run of the output (every axis before the
    concat axis has size 1), and its tensor is produced by a workload of the same backend, is
    no network output and no part of another Concat; its offset must keep the alignment of
    the backend's lifetime manager. Other readers of a part read it in place: the whole
    lives until they are done. A whole may itself be a part of a later Concat, so a chain of
    Concats (a DenseNet block) shares one buffer.
    """
    parts: dict[int, tuple[int, int]] = {}
    for node in order:
        if node.kind != "Concat" or len(node.writes) != 1 or len(node.reads) < 2:
            continue
        whole = infos.get(node.writes[0])
        shapes = [s for t in node.reads if t in infos and (s := infos[t].shape) is not None]
        if (
            whole is None
            or whole.shape is None
            or whole.num_bytes is None
            or node.writes[0] not in owner
            or len(shapes) < len(node.reads)  # a read's shape is unknown
        ):
            continue
        axes = {a for s in shapes for a, (d, w) in enumerate(zip(s, whole.shape)) if d != w}
        if len(axes) != 1 or any(d != 1 for d in whole.shape[: min(axes)]):
            continue
        backend = owner[node.writes[0]]
        alignment = getattr(managers[backend].lifetime_manager, "alignment", 64)
        offset, found = 0, {}
        for tid in node.reads:
            info = infos[tid]
            if (
                owner.get(tid) == backend
                and offset % alignment == 0
                and tid not in parts
                and tid not in found
                and node.reads.count(tid) == 1
                and tid not in pinned
                and info.num_bytes is not None
            ):
                found[tid] = offset
            offset += info.num_bytes or 0
        if offset == whole.num_bytes:
            parts.update({tid: (node.writes[0], at) for tid, at in found.items()})
    return parts


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
        if node.view and node.reads and node.reads[0] in produced:
            aliases.update({t: node.reads[0] for t in node.writes})
        else:
            owner.update({t: node.backend for t in node.writes})
    parts = _concat_parts(order, infos, pinned, owner, managers)
    dynamic = 0
    per_backend: dict[str, dict[int, int]] = {b: {} for b in dict.fromkeys(n.backend for n in order)}
    for tid, backend in owner.items():
        if tid in parts:
            continue
        info = infos.get(tid)
        if info is None or info.num_bytes is None:
            dynamic += 1
            continue
        per_backend[backend][tid] = info.num_bytes
    plans, report = {}, {}
    for backend, sizes in per_backend.items():
        lifetimes = analyze(steps, sizes, pinned, aliases, {t: whole for t, (whole, _) in parts.items()})
        plan = managers[backend].lifetime_manager.plan(lifetimes)
        _place_parts(plan, parts, infos)
        plans[backend] = plan
        report[backend] = BackendMemory(
            plan.arena_bytes, lifetimes.no_reuse_bytes(), lifetimes.lower_bound_bytes(), len(sizes)
        )
    return MemoryLayout(plans, report, dynamic)


def _place_parts(
    plan: MemoryPlan, parts: Mapping[int, tuple[int, int]], infos: Mapping[int, TensorInfo]
) -> None:
    """Give each part of a planned whole its place: the whole's offset plus its own (a part
    may itself be the whole of parts, placed once it is)."""
    pending = dict(parts)
    while pending:
        placed = {t: v for t, v in pending.items() if v[0] in plan.placements}
        if not placed:
            return  # wholes of another backend's plan
        for tid, (whole, at) in placed.items():
            nbytes = infos[tid].num_bytes
            assert nbytes is not None  # only tensors of known size become parts
            plan.placements[tid] = Placement(plan.placements[whole].offset + at, nbytes)
            del pending[tid]
