"""Runtime and LoadedNetwork: load an optimized network, then ``await model.run(feeds)``.

::

    async with flowrt.Runtime() as rt:
        model = await rt.load(flowrt.optimize(net, backends=["CpuRef"]))
        outputs = await model.run({"data": x})
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Mapping
from typing import Any

import attrs
import numpy as np
import trio

from flowrt.engine.graph.graph import Layer
from flowrt.engine.graph.optimizer import OptimizedNetwork
from flowrt.engine.memory.manager import MemoryManager
from flowrt.engine.memory.planner import MemoryLayout, PlannedNode, plan_memory
from flowrt.engine.memory.pool import PoolManager
from flowrt.engine.scheduler.dataflow import Dataflow, build_dataflow
from flowrt.engine.scheduler.executor import Binding, execute
from flowrt.engine.scheduler.feeds import check_feeds, check_output_buffers
from flowrt.errors import BackendError, FlowrtError
from flowrt.profiling import ProfileRecord
from flowrt.registry import BackendRegistry, WorkloadInfo, backend_registry
from flowrt.registry.dynamic import BackendPaths, load_dynamic_backends, unload_dynamic_backends
from flowrt.stream import Stream
from flowrt.types import Priority, TensorInfo
from flowrt.workers.cpu.workers import CpuWorkerPool, default_cpu_workers

logger = logging.getLogger(__name__)


def _bindings(dataflow: Dataflow, layout: MemoryLayout) -> dict[int, Binding]:
    bindings = {}
    for backend, plan in layout.plans.items():
        for tid, placement in plan.placements.items():
            info = dataflow.tensor_infos[tid]
            bindings[tid] = Binding(backend, placement.offset, tuple(info.shape), info.dtype.numpy)  # type: ignore[arg-type]
    return bindings


class LoadedNetwork:
    """A network ready to run: workloads built and prepared, dataflow compiled, memory planned.

    ``run`` may be awaited from any trio run. Up to ``max_in_flight`` runs execute at once,
    each in a pool of its own; further runs wait for a pool.
    """

    def __init__(
        self,
        optimized: OptimizedNetwork,
        dataflow: Dataflow,
        workers: CpuWorkerPool,
        layout: MemoryLayout,
        pools: PoolManager,
        profiling: bool = False,
    ) -> None:
        self.optimized = optimized
        self.dataflow = dataflow
        self.layout = layout
        self.pools = pools
        self._workers = workers
        self._bindings = _bindings(dataflow, layout)
        self.profiling = profiling
        self._records: list[ProfileRecord] = []
        self._runs = itertools.count()

    @property
    def inputs(self) -> dict[str, TensorInfo]:
        """Input name -> expected info, in the network's order."""
        return dict(self.dataflow.input_infos)

    @property
    def outputs(self) -> dict[str, TensorInfo | None]:
        """Output name -> inferred info, in the network's order."""
        return dict(self.dataflow.output_infos)

    async def run(
        self,
        feeds: Mapping[str, Any],
        *,
        priority: Priority = Priority.MEDIUM,
        outputs: Mapping[str, np.ndarray] | None = None,
        profile: bool | None = None,
    ) -> dict[str, np.ndarray]:
        """Run once; returns ``{output name: array}`` — arrays the caller owns, never pool memory.

        Feeds are checked first (InputError, DataTypeError, ShapeError) and read in place.
        ``outputs`` binds caller arrays (ONNX Runtime's IOBinding): those outputs are written
        into them, and they are what is returned. A failing workload raises RunError.
        Cancelling the calling scope stops the run at the next workload. The run's memory
        pool is awaited by ``priority`` (first come, first served within one) and given
        back however the run ends. ``profile`` (default: the runtime's ``profiling``) records
        each workload's timing; :meth:`profile` returns the records.
        """
        arrays = check_feeds(self.dataflow.input_infos, feeds)
        bound = check_output_buffers(self.dataflow.output_infos, outputs)
        record = (
            self._recorder(next(self._runs)) if (self.profiling if profile is None else profile) else None
        )
        async with self.pools.acquire(int(priority)) as pool:
            results = await execute(
                self.dataflow, arrays, self._workers.run_sync, pool, self._bindings, record
            )
        for name, target in bound.items():
            np.copyto(target, results[name])
            results[name] = target
        return results

    def _recorder(self, run: int):
        def record(node, worker: str, start_ns: int, end_ns: int) -> None:
            self._records.append(
                ProfileRecord(run, node.layer, node.kind, node.backend, worker, start_ns, end_ns)
            )

        return record

    def profile(self, *, clear: bool = False) -> list[ProfileRecord]:
        """The workload records of every profiled run so far (``clear``: and forget them)."""
        records = list(self._records)
        if clear:
            self._records.clear()
        return records

    def stream(self, *, max_in_flight: int | None = None, priority: Priority = Priority.MEDIUM) -> Stream:
        """A bounded stream of requests, results in submission order (see ``flowrt.stream``).

        ``max_in_flight`` defaults to the number of memory pools the model was loaded with.
        """
        return Stream(self, self.pools.count if max_in_flight is None else max_in_flight, priority)

    def memory_report(self) -> dict[str, dict[str, int]]:
        """Per backend: ``arena_bytes`` (one pool), ``no_reuse_bytes`` (all intermediate
        tensors summed), ``lower_bound_bytes`` (largest total live at one step of the
        schedule) and ``tensors`` (how many were planned)."""
        return {b: attrs.asdict(m) for b, m in self.layout.report.items()}


class Runtime:
    """Owns the backend registry and the worker capacity; loads optimized networks.

    Use as ``async with Runtime() as rt``, which starts ``cpu_workers`` CPU worker actors
    (default: the cores this process may use) and stops them at its end; they bound how many
    segments run at once, and CpuAcc kernels split their windows into that many slices. A run
    crosses into a worker once: its workloads run back to back, each spread over the cores;
    ``parallel_branches=True`` instead runs independent branches as segments of their own, on
    different workers at once (see ``flowrt.engine.scheduler.dataflow``). ``zero_memory_on_release`` zeroes a memory
    pool before it is lent to the next run (for sensitive data). ``profiling`` makes every
    run of the networks it loads record per-workload timings (see ``LoadedNetwork.profile``).
    Runs waiting for a memory pool are served by priority, first come first served within one;
    a waiting run gains one priority level every ``priority_aging`` seconds, so LOW is never
    starved.

    Dynamic backends (see ``flowrt.registry.dynamic``) are loaded when the runtime is created,
    as Arm NN does: from the directories of ``backend_paths`` (which overrides the
    ``FLOWRT_BACKEND_PATHS`` environment variable, colon-separated; ``[]`` searches none) and
    from the ``flowrt.backends`` entry-point group. Each one loaded is registered in
    ``registry`` (default: the process default registry), so ``flowrt.optimize`` can name it
    once the runtime exists; invalid ones are skipped with a logged warning. What was found,
    loaded and skipped is kept as ``dynamic_backends`` (a ``DynamicBackendReport``). The
    backends this runtime registered are unregistered when it closes (the end of its
    ``async with``); an id that was already registered is skipped, never replaced.
    """

    def __init__(
        self,
        registry: BackendRegistry | None = None,
        *,
        cpu_workers: int | None = None,
        zero_memory_on_release: bool = False,
        profiling: bool = False,
        priority_aging: float = 1.0,
        backend_paths: BackendPaths = None,
        parallel_branches: bool = False,
    ) -> None:
        self.registry = registry or backend_registry()
        self.cpu_workers = cpu_workers or default_cpu_workers()
        if self.cpu_workers < 1:
            raise FlowrtError(f"cpu_workers must be at least 1, got {self.cpu_workers}")
        self.zero_memory_on_release = zero_memory_on_release
        self.profiling = profiling
        if priority_aging <= 0:
            raise FlowrtError(f"priority_aging must be a positive number of seconds, got {priority_aging}")
        self.priority_aging = priority_aging
        self.parallel_branches = parallel_branches
        self._workers: CpuWorkerPool | None = None
        # Loaded last, so a bad argument above never leaves backends registered.
        self.dynamic_backends = load_dynamic_backends(self.registry, backend_paths)
        self._owns_dynamic_backends = True

    async def __aenter__(self) -> Runtime:
        self._workers = await CpuWorkerPool(self.cpu_workers).__aenter__()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        workers, self._workers = self._workers, None
        try:
            if workers is not None:
                await workers.__aexit__(*exc_info)
        finally:
            self._unload_dynamic_backends()

    def _unload_dynamic_backends(self) -> None:
        """Unregister the dynamic backends this runtime registered (once), as Arm NN does when
        its runtime is destroyed."""
        if self._owns_dynamic_backends:
            self._owns_dynamic_backends = False
            unload_dynamic_backends(self.registry, self.dynamic_backends)

    async def load(self, optimized: OptimizedNetwork, *, max_in_flight: int | None = None) -> LoadedNetwork:
        """Build and prepare every workload and plan memory; heavy one-time work happens here.

        ``max_in_flight`` pools are allocated (default: the runtime's ``cpu_workers``): that
        many runs of this network execute at once, each in its own memory.
        """
        if self._workers is None:
            raise FlowrtError("Runtime.load needs an active runtime: use 'async with Runtime() as rt'")
        if not isinstance(optimized, OptimizedNetwork):
            raise FlowrtError(
                f"Runtime.load expects an OptimizedNetwork (from flowrt.optimize), got {type(optimized).__name__}"
            )
        pools = self.cpu_workers if max_in_flight is None else max_in_flight
        if not isinstance(pools, int) or pools < 1:
            raise FlowrtError(f"max_in_flight must be a positive int, got {pools!r}")
        return await trio.to_thread.run_sync(self._build, optimized, pools)

    def _build(self, optimized: OptimizedNetwork, pool_count: int) -> LoadedNetwork:
        factories: dict[str, Any] = {}
        managers: dict[str, MemoryManager] = {}

        def make_workload(layer: Layer, info: WorkloadInfo):
            bid: str = layer.backend  # type: ignore[assignment]
            if bid not in factories:
                backend = self.registry.get(bid)
                managers[bid] = backend.create_memory_manager() or MemoryManager()
                factories[bid] = backend.create_workload_factory(managers[bid])
            try:
                workload = factories[bid].create_workload(info)
                workload.prepare()
            except FlowrtError:
                raise
            except Exception as e:
                raise BackendError(
                    f"backend {bid} failed to build layer {layer.name!r} ({layer.kind}): {e}"
                ) from e
            return workload

        dataflow = build_dataflow(optimized.graph, make_workload, parallel_branches=self.parallel_branches)
        order = [
            PlannedNode(
                n.kind,
                n.backend,
                tuple(t for t in n.inputs if t is not None),
                tuple(t for t in n.outputs if t is not None),
            )
            for n in dataflow.order
        ]
        layout = plan_memory(order, dataflow.tensor_infos, set(dataflow.outputs.values()), managers)
        arena_bytes = {b: plan.arena_bytes for b, plan in layout.plans.items()}
        allocators = {b: managers[b].allocator for b in arena_bytes}
        pools = PoolManager(
            pool_count,
            arena_bytes,
            allocators,
            zero_on_release=self.zero_memory_on_release,
            aging_interval=self.priority_aging,
        )
        return LoadedNetwork(optimized, dataflow, self._workers, layout, pools, self.profiling)  # type: ignore[arg-type]
