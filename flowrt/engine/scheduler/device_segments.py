"""How a run enqueues a device segment: its uploads, its workloads, its downloads.

A device workload runs through its ``enqueue(queue, inputs, outputs)``, or, in a memory
pool, as launches it recorded there (``record(queue, inputs, outputs)`` returns the results
and an object whose ``enqueue(queue)`` repeats them, or None; see GpuAcc's ``launches``).
The pool's first run of a segment runs the workloads as they are (the backend's scratch
memory grows to its size), its second records them, and later runs take the segment's
*program*: each run of consecutive recorded workloads is one step, a single object that
enqueues all their launches (``chain``), after which their outputs (the pool's planned
tensors) are published together — no Python per layer. A view layer (a Reshape) of memory
that is the same each run joins the step too: its outputs, recorded once, are published with
the step's, and the layers reading them record their launches. A run that profiles takes the
recorded launches layer by layer, so that each layer is timed.

``enqueue_segment`` is a generator: it yields after each command it enqueues (an upload, a
launch, a workload's commands), so that the queue actor serving it may cut the segment into
chunks, each admitted to the device on its own (see GpuAcc's ``queues``), and returns once
the downloads are enqueued.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Generator, Mapping, Sequence
from typing import Any

import attrs

from flowrt.engine.memory.planner import is_view
from flowrt.engine.memory.pool import MemoryPool
from flowrt.engine.scheduler.dataflow import Segment, WorkloadNode, host_slots
from flowrt.errors import RunError


@attrs.frozen
class BoundGroup:
    """Consecutive recorded workloads of a segment: their launches as one, the tensors they
    leave in the pool by id, and the tensors they read (released once they have run)."""

    nodes: tuple[WorkloadNode, ...]
    launches: Any
    outputs: Mapping[int, Any]
    inputs: tuple[int | None, ...]


@attrs.frozen
class ViewOutputs:
    """A view layer's outputs recorded in its pool (a Reshape of memory that is the same each
    run): the same tensors every run, so a program publishes them with the recorded group
    the view sits in and runs nothing for it."""

    outputs: Mapping[int, Any]

    def enqueue(self, queue: Any) -> bool:
        """A view enqueues nothing: run layer by layer (profiled), it goes through its code."""
        return False


class RunStop:
    """Whether a run should stop (set from any thread, read by its workers between
    workloads): a flag, not a ``threading.Event``, which nobody waits on here and which took
    2 us of each run's fixed cost to make."""

    __slots__ = ("_set",)

    def __init__(self) -> None:
        self._set = False

    def set(self) -> None:
        self._set = True

    def is_set(self) -> bool:
        return self._set


class DeviceSegments:
    """The device half of a run's state (the executor's ``_RunState`` is one)."""

    pool: MemoryPool | None
    values: dict[int, Any]
    device_values: dict[int, Any]
    uploaded: set[int]
    views: set[int]
    # Network outputs the caller asked to keep on the device, and those the run made there.
    on_device: frozenset[int]
    device_outputs: dict[int, Any]
    host_reads: frozenset[int]  # tensors the host reads (host workloads, host slots)
    constants: Mapping[int, Any]
    bindings: Mapping[int, Any]
    direct: Mapping[int, Any]
    stop: RunStop
    record: Callable[..., None] | None
    _targets: Callable[[WorkloadNode], list[Any] | None]
    _store: Callable[[WorkloadNode, Sequence[Any], dict[int, Any]], None]
    _release: Callable[[Any], None]

    def enqueue_segment(
        self, segment: Segment, runner: Any, queue: Any, keep: list[Any]
    ) -> Generator[None, None, None]:
        """Enqueue a device segment on ``queue`` (from its queue actor, in the trio thread):
        its uploads, its workloads, its downloads, yielding after each command but the
        downloads. Nothing waits; the transfers' events go to ``keep``, which the caller holds
        until the device has finished. A DeviceArray feed is not uploaded (its tensor is in
        ``device_values`` already); an output of ``on_device`` is copied within the device
        into a new DeviceArray (``device_outputs``), and downloaded only where the host
        reads it too."""
        for tid in segment.uploads:
            if tid in self.device_values:  # a DeviceArray feed: read where it is
                continue
            self.device_values[tid], event = runner.upload(queue, self.values[tid])
            keep.append((self.device_values[tid], event))  # both alive until the device is done
            self.uploaded.add(tid)
            yield
        bound, recorded, program = self._device_program(segment)
        # A profiled run goes layer by layer, so that each layer is timed.
        if program is None or self.record is not None or not (yield from self._run_program(program, queue)):
            launched = getattr(runner, "launched", None)
            for node in segment.nodes:
                if self.stop.is_set():
                    return
                self._run_node(node, queue, bound, recorded, launched)
                yield
        for tid in segment.downloads:
            if tid in self.on_device:  # a copy within the device: the pool's bytes are reused
                self.device_outputs[tid], event = runner.copy_out(queue, self.device_values[tid])
                keep.append(event)
                if tid not in self.host_reads:
                    continue
            into = self.direct.get(tid)
            if into is None:
                self.values[tid], event = runner.download(queue, self.device_values[tid])
            else:
                self.values[tid], event = into, runner.download_into(queue, self.device_values[tid], into)
            keep.append(event)

    def _device_program(
        self, segment: Segment
    ) -> tuple[Mapping[str, Any], dict[str, Any] | None, list[Any] | None]:
        """The recorded launches of ``segment``'s workloads in this run's pool (by layer),
        where this run records them (its pool's second run of the segment), and the
        segment's program once they are recorded."""
        pool = self.pool
        if pool is None:
            return {}, None, None
        if segment.index not in pool.ran:
            pool.ran.add(segment.index)
            return {}, None, None
        key = ("device", segment.index)
        bound = pool.programs.get(key)
        if bound is None:
            bound = pool.programs[key] = {}
            return {}, bound, None
        program = pool.programs.get(("device program", segment.index))
        if program is None:
            program = pool.programs["device program", segment.index] = self._program(segment, bound)
        return bound, None, program

    def _program(self, segment: Segment, bound: Mapping[str, Any]) -> list[Any]:
        """``segment``'s steps: groups of consecutive recorded workloads, and the others."""
        steps: list[Any] = []
        run: list[WorkloadNode] = []

        def close_run() -> None:
            parts = [bound[node.layer] for node in run if type(bound[node.layer]) is not ViewOutputs]
            chain = getattr(type(parts[0]), "chain", None) if parts else None
            launches = chain(parts) if chain is not None else None
            if launches is None:
                steps.extend(run)
            else:
                outputs: dict[int, Any] = {}
                for node in run:
                    part = bound[node.layer]
                    if type(part) is ViewOutputs:  # its tensors, published with the group's
                        outputs.update(part.outputs)
                        continue
                    targets = self._targets(node) or []
                    outputs.update({t: v for t, v in zip(node.outputs, targets) if t is not None})
                inputs = tuple(t for node in run for t in node.inputs)
                steps.append(BoundGroup(tuple(run), launches, outputs, inputs))
            run.clear()

        for node in segment.nodes:
            if bound.get(node.layer) is not None:
                run.append(node)
                continue
            close_run()
            steps.append(node)
        close_run()
        return steps

    def _run_program(self, program: list[Any], queue: Any) -> Generator[None, None, bool]:
        """Enqueue the program's steps, yielding after each launch; False, with nothing
        enqueued, when its launches do not take this submission (they stand down: its
        scratch memory is not theirs)."""
        groups = [step for step in program if type(step) is BoundGroup]
        if groups and not groups[0].launches.ready():
            return False
        for step in program:
            if self.stop.is_set():
                return True
            if type(step) is BoundGroup:
                launches = step.launches
                try:
                    if hasattr(launches, "enqueue_each"):  # one launch at a time
                        yield from launches.enqueue_each(queue)
                    else:
                        launches.enqueue(queue)
                        yield
                except Exception as e:
                    first = step.nodes[0]
                    raise RunError(first.layer, first.backend, e) from e
                self.device_values.update(step.outputs)
                self._release(step.inputs)
            else:
                self._run_node(step, queue, {}, None)
                yield
        return True

    def _run_node(
        self,
        node: WorkloadNode,
        queue: Any,
        bound: Mapping[str, Any],
        recorded: dict[str, Any] | None,
        launched: Callable[[], int] | None = None,
    ) -> None:
        """Enqueue one workload; a profiled run records it with its launches (``launched``:
        the runner's count, where it keeps one)."""
        counted = launched if self.record is not None else None
        start, before = time.perf_counter_ns(), counted() if counted is not None else 0
        try:
            self._enqueue_node(node, queue, bound, recorded)
        except Exception as e:
            raise RunError(node.layer, node.backend, e) from e
        if self.record is not None:
            launches = counted() - before if counted is not None else 0
            self.record(node, f"{node.backend} queue", start, time.perf_counter_ns(), launches=launches)
        self._release(node.inputs)

    def _enqueue_node(
        self, node: WorkloadNode, queue: Any, bound: Mapping[str, Any], recorded: dict[str, Any] | None
    ) -> None:
        """Enqueue a device workload: as its recorded launches where it has them (and they
        take this submission), recorded where this run records, else through its ``enqueue``."""
        targets = self._targets(node)
        launches = bound.get(node.layer)
        if launches is not None and launches.enqueue(queue):
            self._store(node, targets, self.device_values)  # type: ignore[arg-type]  # recorded: all planned
            return
        on_host = host_slots(node)
        args = [self._device_argument(tid, i in on_host) for i, tid in enumerate(node.inputs)]
        workload: Any = node.workload
        if (
            recorded is not None
            and targets is not None
            and hasattr(workload, "record")
            and all(self._same_each_run(tid) for tid in node.inputs)
        ):
            results, recorded[node.layer] = workload.record(queue, args, targets)
        else:
            results = workload.enqueue(queue, args, targets)
        self._store(node, results, self.device_values)
        # A view with no planned bytes of its own (the planner's alias) of memory that is the
        # same each run (a view copied into planned bytes is a copy, every run).
        if targets is None and is_view(node) and node.inputs and self._same_each_run(node.inputs[0]):
            outputs = [t for t in node.outputs if t is not None]
            self.views.update(outputs)
            if recorded is not None:
                recorded[node.layer] = ViewOutputs({t: self.device_values[t] for t in outputs})

    def _same_each_run(self, tid: int | None) -> bool:
        """Whether tensor ``tid`` is the same in every run in this pool: a constant, planned
        pool memory this run did not upload to (an upload is a new buffer), or a view of such
        memory (a Reshape's output: the planner gives it no bytes of its own, and its layer
        returns the same bytes each run) that this run made."""
        return (
            tid is None
            or tid in self.constants
            or (tid in self.bindings and tid not in self.uploaded)
            or tid in self.views
        )

    def _device_argument(self, tid: int | None, on_host: bool) -> Any:
        """A device workload's input: the device copy, except for slots it reads on the host
        and for constants (device workloads keep their own copies of those)."""
        if tid is None:
            return None
        if on_host or tid not in self.device_values:
            return self.values[tid]
        return self.device_values[tid]
