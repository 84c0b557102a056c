"""The trio executor: one run of a dataflow as a nursery of segment tasks.

Each segment waits for the segments it depends on, then goes to its runner, which the runtime
hands the executor: a :class:`HostRunner` (the CPU worker pool) for host segments, a
:class:`DeviceRunner` per device backend. A host segment crosses once into a worker thread
that runs its workloads in order; before each one the runner's ``between_workloads`` shares
the cores out again and gives the job's context (:class:`~.job.JobContext`), which the
workloads that take one (``takes_job``) receive. A device segment is one submission to its
backend's device runner (GpuAcc's queue actor of the run's priority): its uploads, its
workloads and its downloads are enqueued together on one in-order queue, and the task
wakes when the device has finished them — no thread waits per kernel. Workloads that write
in place get their planned pool memory as outputs (device tensors for a device arena); the
others' results are copied into it. A network output the caller binds to an array of its own
(``outputs=``) is written there by its producing workload instead, or downloaded there from
the device: no copy (see :func:`direct_outputs` for when). So is a large output the caller
does not bind, into a new array of its own each run (:func:`own_outputs`), where it would
otherwise be written into the pool and copied out. Which tensors cross between host and device is the
dataflow's decision (``Segment.uploads`` / ``downloads``): a run keeps a tensor's host value
and its device value apart, and reads the one its placement needs.

A host segment of the built-in CPU backends whose workloads took less than ``INLINE_S`` in
its last run runs on the executor's own thread instead, once its pool has its program: on
this project's 2-core machine a job's trip to a worker thread and its result's trip back
cost 0.1-0.2 ms of thread wake-ups, more than such a segment. There it runs on one thread,
slower than on a worker's several, so it stays there while it takes less than
``STAY_INLINE`` times the bound: with one bound, a segment of 0.06 ms on two threads and
0.11 on one went back and forth, its runs alternating between 0.12 and 0.35 ms. Not while
the run is profiled, nor for a network whose inputs may change shape (a new shape may
compile kernels).

A failing workload cancels the run and surfaces as a RunError naming the layer and backend.
A run cancelled from outside stops at the next workload boundary (a device segment once
enqueued runs to its end); no thread is left running a cancelled run's work.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

import attrs
import numpy as np
import trio

from flowrt.engine.memory.pool import MemoryPool
from flowrt.engine.scheduler.binding import BoundStep, bind_segment
from flowrt.engine.scheduler.dataflow import Dataflow, Segment, WorkloadNode, host_reads
from flowrt.engine.scheduler.device_array import DeviceArray
from flowrt.engine.scheduler.device_segments import DeviceSegments, RunStop
from flowrt.engine.scheduler.job import JobContext
from flowrt.engine.scheduler.outputs import LargeOutput, direct_outputs, own_outputs
from flowrt.errors import FlowrtError, RunError

# A host segment that ran in less than this (seconds) runs on the executor's thread.
INLINE_S = 1e-4
# A segment run on the executor's thread stays there while it takes less than this many
# times INLINE_S (on one thread, where the handoff it saves costs about as much).
STAY_INLINE = 2
# The backends whose workloads only compute on the host (never wait on anything else).
INLINE_BACKENDS = frozenset({"CpuAcc", "CpuRef"})
# The job context of a segment run on the executor's thread: one thread, no parallel region.
_ONE_THREAD = JobContext(1)


@attrs.frozen
class Binding:
    """Where a planned tensor lives in a pool: backend arena, byte offset, shape and dtype."""

    backend: str
    offset: int
    shape: tuple[int, ...]
    dtype: np.dtype


class DeviceRunner(Protocol):
    """What a device backend's context offers the executor (GpuAcc's ``GpuBackendContext``).

    ``submit(priority, enqueue, owner)`` has ``enqueue(queue)`` put commands on an in-order
    queue of that priority and returns once the device has finished them; ``owner`` is the
    run's memory pool (None outside one), whose own temporaries the workloads may use. ``upload(queue, array)`` and
    ``download(queue, tensor)`` enqueue a copy without waiting and return the copy and an
    object to keep until the work is done (the copy's event); ``download_into(queue, tensor,
    array)`` enqueues the copy into a C-contiguous host array of the tensor's shape and dtype
    and returns that object; ``copy_out(queue, tensor)`` enqueues a copy into new device
    memory and returns it as a DeviceArray of this runner, with that object. A runner may
    also have ``launched()``, a count of the kernel launches it has enqueued: a profiled run
    records each workload's.
    """

    async def submit(self, priority: int, enqueue: Callable[[Any], Any], owner: Any = None) -> None: ...

    def upload(self, queue: Any, array: np.ndarray) -> tuple[Any, Any]: ...

    def download(self, queue: Any, tensor: Any) -> tuple[np.ndarray, Any]: ...

    def download_into(self, queue: Any, tensor: Any, array: np.ndarray) -> Any: ...

    def copy_out(self, queue: Any, tensor: Any) -> tuple[DeviceArray, Any]: ...


class HostRunner(Protocol):
    """What runs host segments for the executor (``CpuWorkerPool``).

    ``run_sync(fn, *args, priority=..., on_cancel=...)`` runs a blocking function on a worker
    thread and returns its result; it must not return before ``fn`` has finished, even when
    cancelled, and calls ``on_cancel`` (in trio) when cancelled while ``fn`` runs.
    ``between_workloads()`` is called on that thread before each workload of a host segment:
    it may wait (for work of a higher priority) and returns the job's context now (None where
    there is none), which the workloads that take one receive.
    """

    async def run_sync(
        self,
        fn: Callable[..., Any],
        *args: Any,
        priority: int = ...,
        on_cancel: Callable[[], None] | None = None,
    ) -> Any: ...

    def between_workloads(self) -> JobContext | None: ...


class _RunState(DeviceSegments):
    """The tensors of one run, and what lets its threads stop early.

    ``values`` holds host tensors, ``device_values`` device ones; a tensor that crosses has
    both (as the dataflow's uploads and downloads say).
    """

    def __init__(
        self,
        dataflow: Dataflow,
        feeds: Mapping[str, np.ndarray],
        pool: MemoryPool | None,
        bindings: Mapping[int, Binding],
        direct: Mapping[int, np.ndarray] | None = None,
        on_device: frozenset[int] = frozenset(),
        reads_on_host: frozenset[int] | None = None,
    ) -> None:
        self.pool = pool
        # Network outputs written straight into the caller's arrays, by tensor id.
        self.direct = direct or {}
        self.bindings = bindings if pool is not None else {}
        # Each workload's output views, worked out on the first run that borrows the pool.
        self.placements: dict[str, tuple[list[Any] | None, tuple[Any, ...], int, bool]] = (
            pool.placements if pool is not None else {}
        )
        self.constants = dataflow.constants
        self.values: dict[int, np.ndarray] = dict(dataflow.constants)
        self.device_values: dict[int, Any] = {}
        device_feeds = any(isinstance(f, DeviceArray) for f in feeds.values())
        self.host_reads = frozenset()
        if on_device or device_feeds:
            self.host_reads = host_reads(dataflow) if reads_on_host is None else reads_on_host
        for name, tid in dataflow.inputs.items():
            feed = feeds[name]
            if isinstance(feed, DeviceArray):
                # Read where it is by device workloads; a host copy only where the host reads it.
                self.device_values[tid] = feed.tensor
                feed = feed.numpy() if tid in self.host_reads else feed
            self.values[tid] = feed
        self.on_device = on_device
        self.device_outputs: dict[int, DeviceArray] = {}
        self.uploaded: set[int] = set()  # tensors this run uploaded (new device buffers each run)
        self.views: set[int] = set()  # views this run made of memory that is the same each run
        self.readers = dict(dataflow.readers)
        self.keep = set(dataflow.outputs.values())
        self.lock = threading.Lock()
        self.stop = RunStop()
        self.error: RunError | None = None
        self.record: Callable[..., None] | None = None
        self.between: Callable[[], JobContext | None] = lambda: None

    def run_segment(self, segment: Segment, between: Callable[[], JobContext | None] | None = None) -> None:
        """Run a segment's workloads in order (in a worker thread): as the pool's program for
        it (bound steps, see ``program``), unless the run is profiled (each workload timed).
        ``between`` replaces the runner's hook between workloads (for a segment run inline)."""
        # The loop is a small model's cost per layer beside its kernels: attributes are read
        # once, and the clock only when the run is profiled.
        values, stop, record = self.values, self.stop, self.record
        between = between or self.between
        steps = segment.nodes if record is not None or self.pool is None else self.program(segment)
        if steps is None:  # the pool's first run of the segment: its program is made on the next
            steps = segment.nodes
        start = 0
        for node in steps:
            job = between()  # it may wait (for HIGH work), during which the run may be cancelled
            if stop.is_set():
                return
            if type(node) is BoundStep:
                node.run(values)
                continue
            args = [values[tid] if tid is not None else None for tid in node.inputs]
            if record is not None:
                start = time.perf_counter_ns()
            try:
                targets, views, produced, takes_job = self._placement(node)
                if self.direct:
                    targets, views = self._redirect(node, targets, views)
                if takes_job:
                    results = node.workload.execute(args, targets, job)  # type: ignore[call-arg]  # a takes_job workload's execute
                else:
                    results = node.workload.execute(args, targets) if targets else node.workload.execute(args)  # type: ignore[call-arg]  # an in-place workload's execute
                if len(results) < produced:
                    raise FlowrtError(f"workload returned {len(results)} outputs, expected {produced}")
                for tid, value, view in zip(node.outputs, results, views):
                    if tid is not None:
                        values[tid] = value if value is view else self._bind(value, view)
            except Exception as e:
                raise RunError(node.layer, node.backend, e) from e
            if record is not None:
                record(node, threading.current_thread().name, start, time.perf_counter_ns())
            self._release(node.inputs)

    def program(self, segment: Segment) -> Sequence[WorkloadNode | BoundStep] | None:
        """The steps of ``segment`` in this run's pool, made on the pool's second run of it
        (None on the first, which runs the workloads as they are: binding them, which may
        time and check them, stays out of a model's first output)."""
        pool = self.pool
        assert pool is not None  # run_segment asks for a program only in a pool
        if segment.index not in pool.ran:
            pool.ran.add(segment.index)
            return None
        direct = self.direct
        redirected = (
            frozenset(node.layer for node in segment.nodes if any(t in direct for t in node.outputs))
            if direct
            else frozenset()
        )
        key = (segment.index, redirected) if redirected else segment.index
        steps = pool.programs.get(key)
        if steps is None:
            # The producers of outputs bound by the caller stay steps of their own: their
            # targets change from run to run.
            steps = pool.programs[key] = bind_segment(
                segment, self.constants, self._placement, unbound=redirected
            )
        return steps

    def _redirect(
        self, node: WorkloadNode, targets: list[Any] | None, views: tuple[Any, ...]
    ) -> tuple[list[Any] | None, tuple[Any, ...]]:
        """``node``'s targets and views with the caller's arrays in place of the pool views of
        the outputs bound to them."""
        direct = self.direct
        if not any(t in direct for t in node.outputs):
            return targets, views
        views = tuple(direct.get(t, v) if t is not None else v for t, v in zip(node.outputs, views))
        return (list(views) if targets is not None else None), views

    def _store(self, node: WorkloadNode, results: Sequence[Any], values: dict[int, Any]) -> None:
        if len(results) < sum(1 for t in node.outputs if t is not None):
            raise FlowrtError(f"workload returned {len(results)} outputs, expected {len(node.outputs)}")
        for tid, value in zip(node.outputs, results):
            if tid is not None:
                values[tid] = value

    def _placement(self, node: WorkloadNode) -> tuple[list[Any] | None, tuple[Any, ...], int, bool]:
        """``node``'s output targets (its outputs' planned views, when it writes in place and
        all are planned; else None), each output's planned view (None: unplanned), how many
        outputs it must return, and whether it takes the job's context (``takes_job``: it is
        called ``execute(inputs, targets, job)``)."""
        placement = self.placements.get(node.layer)
        if placement is None:
            views = tuple(self._view(tid) for tid in node.outputs)
            in_place = getattr(node.workload, "writes_in_place", False) and all(v is not None for v in views)
            produced = sum(1 for tid in node.outputs if tid is not None)
            placement = self.placements[node.layer] = (
                list(views) if in_place and views else None,
                views,
                produced,
                bool(getattr(node.workload, "takes_job", False)),
            )
        return placement

    def _targets(self, node: WorkloadNode) -> list[Any] | None:
        """The planned pool views of ``node``'s outputs, when it writes in place and all are planned."""
        return self._placement(node)[0]

    def _view(self, tid: int | None) -> Any:
        binding = self.bindings.get(tid) if tid is not None else None
        if binding is None:
            return None
        assert self.pool is not None  # there are bindings only with a pool
        return self.pool.view(binding.backend, binding.offset, binding.shape, binding.dtype)

    def _bind(self, value: np.ndarray, target: np.ndarray | None) -> np.ndarray:
        """Move a result into its planned place ``target`` in the run's pool (unplanned ones,
        ``target`` None, stay as they are)."""
        if target is None:
            return value
        if value.shape != target.shape or value.dtype != target.dtype:
            raise FlowrtError(
                f"workload produced {value.dtype}{value.shape}, expected {target.dtype}{target.shape}"
            )
        np.copyto(target, value)
        return target

    def _release(self, tensor_ids) -> None:
        with self.lock:
            for tid in tensor_ids:
                if tid is None or tid not in self.readers:
                    continue
                self.readers[tid] -= 1
                if self.readers[tid] == 0 and tid not in self.keep:
                    self.values.pop(tid, None)
                    self.device_values.pop(tid, None)


def run_nested(dataflow: Dataflow, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Run a host dataflow once, on the calling thread and without a memory pool: how a
    workload runs a subgraph of its layer (an If branch, a Loop or Scan body) from inside the
    segment it is part of. ``feeds`` holds a value for each of the dataflow's inputs (others
    are ignored). The outputs are returned as the workloads left them: they may be feeds or
    constants, which the caller must not write. A failing workload raises RunError naming it.
    """
    state = _RunState(dataflow, feeds, None, {})
    for segment in dataflow.segments:  # the serial cut: each after the one before
        if segment.device:
            raise RunError(
                segment.nodes[0].layer, segment.backend, FlowrtError("a subgraph runs on the host only")
            )
        state.run_segment(segment)
    return {name: state.values[tid] for name, tid in dataflow.outputs.items()}


async def execute(
    dataflow: Dataflow,
    feeds: Mapping[str, np.ndarray],
    host: HostRunner,
    pool: MemoryPool | None = None,
    bindings: Mapping[int, Binding] | None = None,
    record: Callable[..., None] | None = None,
    *,
    devices: Mapping[str, DeviceRunner] | None = None,
    priority: int = 1,
    outputs: Mapping[str, np.ndarray] | None = None,
    large: Sequence[LargeOutput] = (),
    device_outputs: frozenset[int] = frozenset(),
    reads_on_host: frozenset[int] | None = None,
) -> dict[str, Any]:
    """Run the dataflow once on checked feeds; return fresh output arrays by name, or for the
    names in ``outputs`` (checked caller arrays of their dtype and shape) those arrays, which
    the run wrote (see :func:`direct_outputs`).

    Host segments run on ``host`` (see :class:`HostRunner`), device segments on the runner
    of their backend in ``devices`` (see :class:`DeviceRunner`); ``priority`` is passed to
    both (``run_sync``, ``submit``).

    With a ``pool``, planned intermediate tensors live at their ``bindings`` in it; the pool
    must stay lent until this returns (it does not touch the pool afterwards); the ``large``
    outputs (``outputs.large_outputs``) the caller does not bind get arrays of their own.
    ``record``,
    when given, is called from the worker after each workload with
    ``(node, worker name, start_ns, end_ns)``.

    Feeds may be DeviceArrays of a device runner: read where they are (see
    ``DeviceSegments.enqueue_segment``). Outputs of ``device_outputs`` (tensor ids) made on a
    device come back as new DeviceArrays; ``reads_on_host`` is ``host_reads(dataflow)``,
    where the caller keeps it.
    """
    bound = outputs or {}
    direct = direct_outputs(dataflow, bindings or {}, feeds, bound) if bound else {}
    own = own_outputs(large, bound) if pool is not None else {}
    state = _RunState(dataflow, feeds, pool, bindings or {}, {**direct, **own}, device_outputs, reads_on_host)
    state.record = record
    state.between = host.between_workloads
    done = [trio.Event() for _ in dataflow.segments]

    async def run(segment: Segment, cancel_scope: trio.CancelScope | None) -> None:
        for dep in segment.depends_on:
            await done[dep].wait()
        try:
            await (run_on_device if segment.device else run_on_host)(segment)
        except RunError as e:
            if state.error is None:
                state.error = e
            state.stop.set()
            if cancel_scope is not None:
                cancel_scope.cancel()
            return
        done[segment.index].set()

    costs, inline_costs = dataflow.host_costs, dataflow.inline_costs
    inline = record is None and pool is not None and all(i.is_static for i in dataflow.input_infos.values())

    def timed(segment: Segment) -> None:
        # The runs before a pool's program are not its cost; a segment of other backends
        # never runs inline, so its cost is not kept.
        measured = inline and pool is not None and segment.index in pool.programs and _computes_only(segment)
        began = time.perf_counter()
        state.run_segment(segment)
        if measured:
            costs[segment.index] = time.perf_counter() - began
            inline_costs.pop(segment.index, None)

    async def run_on_host(segment: Segment) -> None:
        if inline and _quick(segment, costs, inline_costs, pool):
            began = time.perf_counter()
            state.run_segment(segment, _one_thread)
            inline_costs[segment.index] = time.perf_counter() - began
            await trio.lowlevel.checkpoint()
            return
        # Cancelled from outside while the worker runs it, the segment stops at its next
        # workload.
        await host.run_sync(timed, segment, priority=priority, on_cancel=state.stop.set)

    async def run_on_device(segment: Segment) -> None:
        runner = (devices or {}).get(segment.backend)
        if runner is None:
            raise RunError(segment.nodes[0].layer, segment.backend, FlowrtError("no device runner"))
        keep: list[Any] = []
        await runner.submit(
            priority, lambda queue: state.enqueue_segment(segment, runner, queue, keep), state.pool
        )

    if len(dataflow.segments) == 1:
        # An all-host network is one segment: no nursery to open (a run's fixed cost).
        await run(dataflow.segments[0], None)
    else:
        async with trio.open_nursery() as nursery:
            for segment in dataflow.segments:
                nursery.start_soon(run, segment, nursery.cancel_scope)
    if state.error is not None:
        raise state.error
    # A run cancelled while a worker ran its segment got here without its outputs.
    await trio.lowlevel.checkpoint_if_cancelled()
    # Downloads are new arrays already; everything else may be pool memory, a feed or a
    # caller's array.
    fresh = dataflow.downloads - state.direct.keys()
    results: dict[str, Any] = {}
    for name, tid in dataflow.outputs.items():
        if tid in state.device_outputs:
            results[name] = state.device_outputs[tid]
            continue
        value, target = state.values[tid], bound.get(name)
        if target is None:
            written = tid in fresh or (tid in own and value is own[tid])
            results[name] = value if written else np.array(value, copy=True)
            continue
        if value is not target:
            np.copyto(target, value)
        results[name] = target
    return results


def _one_thread() -> JobContext:
    return _ONE_THREAD


def _computes_only(segment: Segment) -> bool:
    """Whether every workload of ``segment`` is of a backend of ``INLINE_BACKENDS``."""
    return all(b in INLINE_BACKENDS for b in segment.backend.split("+"))


def _quick(
    segment: Segment, costs: Mapping[int, float], inline_costs: Mapping[int, float], pool: MemoryPool | None
) -> bool:
    """Whether ``segment`` runs on the executor's thread (see the module doc): only segments
    of ``INLINE_BACKENDS`` have a cost (``timed`` keeps no other). Its last run there, if it
    was there, decides; else its last run on a worker."""
    if pool is None or segment.index not in pool.programs:
        return False
    inline = inline_costs.get(segment.index)
    if inline is not None:
        return inline < INLINE_S * STAY_INLINE
    cost = costs.get(segment.index)
    return cost is not None and cost < INLINE_S
