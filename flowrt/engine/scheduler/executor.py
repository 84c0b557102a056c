"""The trio executor: one run of a dataflow as a nursery of segment tasks.

Each segment waits for the segments it depends on, then crosses once into a worker thread
that runs its workloads in order. Workloads that write in place get their planned pool memory
as outputs; the others' results are copied into it. A failing workload cancels the run and surfaces as a
RunError naming the layer and backend. A run cancelled from outside stops at the next
workload boundary; no thread is left running a cancelled run's work.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import attrs
import numpy as np
import trio

from flowrt.engine.memory.pool import MemoryPool
from flowrt.engine.scheduler.dataflow import Dataflow, Segment, WorkloadNode
from flowrt.errors import FlowrtError, RunError


@attrs.frozen
class Binding:
    """Where a planned tensor lives in a pool: backend arena, byte offset, shape and dtype."""

    backend: str
    offset: int
    shape: tuple[int, ...]
    dtype: np.dtype


class _RunState:
    """The tensors of one run, and what lets its threads stop early."""

    def __init__(
        self,
        dataflow: Dataflow,
        feeds: Mapping[str, np.ndarray],
        pool: MemoryPool | None,
        bindings: Mapping[int, Binding],
    ) -> None:
        self.pool = pool
        self.bindings = bindings if pool is not None else {}
        self.values: dict[int, np.ndarray] = dict(dataflow.constants)
        for name, tid in dataflow.inputs.items():
            self.values[tid] = feeds[name]
        self.readers = dict(dataflow.readers)
        self.keep = set(dataflow.outputs.values())
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.error: RunError | None = None
        self.record: Callable[..., None] | None = None

    def run_segment(self, segment: Segment) -> None:
        """Run a segment's workloads in order (in a worker thread)."""
        for node in segment.nodes:
            if self.stop.is_set():
                return
            args = [self.values[tid] if tid is not None else None for tid in node.inputs]
            start = time.perf_counter_ns()
            try:
                targets = self._targets(node)
                results = node.workload.execute(args, targets) if targets else node.workload.execute(args)
                if len(results) < sum(1 for t in node.outputs if t is not None):
                    raise FlowrtError(
                        f"workload returned {len(results)} outputs, expected {len(node.outputs)}"
                    )
                for tid, value in zip(node.outputs, results):
                    if tid is not None:
                        self.values[tid] = self._bind(tid, value)
            except Exception as e:
                raise RunError(node.layer, node.backend, e) from e
            if self.record is not None:
                self.record(node, threading.current_thread().name, start, time.perf_counter_ns())
            self._release(node.inputs)

    def _targets(self, node: WorkloadNode) -> list[np.ndarray] | None:
        """The planned pool views of ``node``'s outputs, when it writes in place and all are planned."""
        if not getattr(node.workload, "writes_in_place", False) or not self.bindings:
            return None
        targets = []
        for tid in node.outputs:
            binding = self.bindings.get(tid) if tid is not None else None
            if binding is None:
                return None
            targets.append(self.pool.view(binding.backend, binding.offset, binding.shape, binding.dtype))  # type: ignore[union-attr]
        return targets

    def _bind(self, tid: int, value: np.ndarray) -> np.ndarray:
        """Move a result into its planned place in the run's pool (unplanned ones stay as they are)."""
        binding = self.bindings.get(tid)
        if binding is None:
            return value
        if value.shape != binding.shape or value.dtype != binding.dtype:
            raise FlowrtError(
                f"workload produced {value.dtype}{value.shape}, expected {binding.dtype}{binding.shape}"
            )
        target = self.pool.view(binding.backend, binding.offset, binding.shape, binding.dtype)  # type: ignore[union-attr]
        if value is not target:
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


async def execute(
    dataflow: Dataflow,
    feeds: Mapping[str, np.ndarray],
    run_sync: Callable[..., Awaitable[Any]],
    pool: MemoryPool | None = None,
    bindings: Mapping[int, Binding] | None = None,
    record: Callable[..., None] | None = None,
) -> dict[str, np.ndarray]:
    """Run the dataflow once on checked feeds; return fresh output arrays by name.

    ``run_sync(fn, *args)`` runs a blocking function on a CPU worker (``CpuWorkerPool.run_sync``);
    it must not return before ``fn`` has finished, even when cancelled.

    With a ``pool``, planned intermediate tensors live at their ``bindings`` in it; the pool
    must stay lent until this returns (it does not touch the pool afterwards). ``record``,
    when given, is called from the worker after each workload with
    ``(node, worker name, start_ns, end_ns)``.
    """
    state = _RunState(dataflow, feeds, pool, bindings or {})
    state.record = record
    done = [trio.Event() for _ in dataflow.segments]

    async def run(segment: Segment, cancel_scope: trio.CancelScope) -> None:
        for dep in segment.depends_on:
            await done[dep].wait()
        try:
            await run_sync(state.run_segment, segment)
        except RunError as e:
            if state.error is None:
                state.error = e
            state.stop.set()
            cancel_scope.cancel()
            return
        done[segment.index].set()

    async def stop_threads_on_cancel() -> None:
        try:
            await trio.sleep_forever()
        finally:
            state.stop.set()

    async with trio.open_nursery() as outer:
        outer.start_soon(stop_threads_on_cancel)
        async with trio.open_nursery() as nursery:
            for segment in dataflow.segments:
                nursery.start_soon(run, segment, nursery.cancel_scope)
        outer.cancel_scope.cancel()
    if state.error is not None:
        raise state.error
    return {name: np.array(state.values[tid], copy=True) for name, tid in dataflow.outputs.items()}
