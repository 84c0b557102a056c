"""Runtime: load an optimized network, then ``await model.run(feeds)`` (``LoadedNetwork``).

::

    async with flowrt.Runtime() as rt:
        model = await rt.load(flowrt.optimize(net, backends=["CpuRef"]))
        outputs = await model.run({"data": x})

The same code runs under ``trio.run`` and ``asyncio.run`` (see ``flowrt.aio``).
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import logging
import os
import threading
from collections.abc import Mapping
from typing import Any

import attrs
import trio

from flowrt.aio import AioLoadedNetwork, AsyncioBridge, async_library, trio_side
from flowrt.engine.graph.graph import Layer
from flowrt.engine.graph.optimizer import OptimizedNetwork
from flowrt.engine.graph.passes.batch import set_batch
from flowrt.engine.loader.dataflow_builder import build_dataflow
from flowrt.engine.memory.budget import MemoryBudget, check_layer_outputs, check_memory_budget, claim_arenas
from flowrt.engine.memory.manager import MemoryManager
from flowrt.engine.memory.planner import PlannedNode, plan_memory
from flowrt.engine.memory.pool import EAGER_DEVICE_POOLS, EAGER_POOLS, PoolManager
from flowrt.engine.memory.weights import WeightsRecord, recording
from flowrt.engine.scheduler.executor import DeviceRunner
from flowrt.errors import BackendError, FlowrtError
from flowrt.gc_pause import collection_paused
from flowrt.hints import check_hint, choose
from flowrt.loaded_network import LoadedNetwork
from flowrt.progress import LoadProgress, layer_progress, load_progress
from flowrt.registry import Backend, BackendRegistry, WorkloadInfo, backend_registry
from flowrt.registry.contexts import call_hooks, check_allocators
from flowrt.registry.dynamic import BackendPaths, load_dynamic_backends, unload_dynamic_backends
from flowrt.types import Priority
from flowrt.validate import (
    check_bool,
    check_choice,
    check_instance,
    check_int,
    check_path,
    check_paths,
    check_seconds,
)
from flowrt.workers.cpu.workers import CpuWorkerPool, default_cpu_workers, job_context
from flowrt.workers.gpu.tuning_mode import TuningMode

logger = logging.getLogger(__name__)


# Each worker is two threads (one in reserve for HIGH): far more than any machine's cores, and
# far fewer than the threads a process may start.
MAX_CPU_WORKERS = 1024
# A job of the lowest priority may pause for two agings in one wait of a thread, whose timeout
# threading caps: a longer aging would make that wait raise OverflowError.
MAX_PRIORITY_AGING = threading.TIMEOUT_MAX / Priority.LOW


@attrs.frozen
class RuntimeOptions:
    """What a runtime tells the backends it makes contexts for (Arm NN's creation options):
    ``opencl_device`` picks GpuAcc's device (see ``flowrt.workers.gpu.device``);
    ``tuning_file`` and ``tuning_mode`` configure GpuAcc's local-work-size tuner (see
    ``flowrt.workers.gpu.tuner``)."""

    opencl_device: str | None = None
    tuning_file: str | None = None
    tuning_mode: str = "none"


def _runtime_options(opencl_device: Any, tuning_file: Any, tuning_mode: Any) -> RuntimeOptions:
    """The options a runtime gives backend contexts, from ``Runtime``'s arguments (checked)."""
    if opencl_device is not None:
        check_instance("opencl_device", opencl_device, str, "a device name (str) or None", where="Runtime")
    mode = tuning_mode.value if isinstance(tuning_mode, TuningMode) else tuning_mode
    return RuntimeOptions(
        opencl_device=opencl_device,
        tuning_file=None if tuning_file is None else check_path("tuning_file", tuning_file, where="Runtime"),
        tuning_mode=check_choice("tuning_mode", mode, [m.value for m in TuningMode], where="Runtime"),
    )


class Runtime:
    """Owns the backend registry and the worker capacity; loads optimized networks.

    Use as ``async with Runtime() as rt``, which starts ``cpu_workers`` CPU worker actors
    (default: the cores this process may use) and stops them at its end (also when the
    block is cancelled with runs in flight: the end still unloads every network, closes the
    runtime's nursery and joins the workers' threads, each wait bounded, and then the
    cancellation goes on); they bound how many
    segments run at once, and CpuAcc kernels split their windows into that many slices. A run
    crosses into a worker once: its workloads run back to back, each spread over the cores;
    ``parallel_branches=True`` instead runs independent branches as segments of their own, on
    different workers at once (see ``flowrt.engine.scheduler.dataflow``). ``zero_memory_on_release`` zeroes a memory
    pool before it is lent to the next run (for sensitive data). ``profiling`` makes every
    run of the networks it loads record per-workload timings (see ``LoadedNetwork.profile``).
    Runs waiting for a memory pool or a CPU worker are served by priority, first come first
    served within one; a waiting run gains one priority level every ``priority_aging``
    seconds, so LOW is never starved. While HIGH work runs on the CPU workers, lower-priority
    runs pause at their next layer, for at most ``priority_aging`` seconds per level in all
    (waiting for a worker included).
    Every argument is checked here (``cpu_workers`` at most ``MAX_CPU_WORKERS``, a finite
    ``priority_aging``): ArgumentError naming it (see ``flowrt.validate``). ResourceError when
    the process cannot start the workers' threads; those started are stopped first.

    Dynamic backends (see ``flowrt.registry.dynamic``) are loaded when the runtime is created,
    as Arm NN does: from the directories of ``backend_paths`` (which overrides the
    ``FLOWRT_BACKEND_PATHS`` environment variable, colon-separated; ``[]`` searches none) and
    from the ``flowrt.backends`` entry-point group. Each one loaded is registered in
    ``registry`` (default: the process default registry), so ``flowrt.optimize`` can name it
    once the runtime exists; invalid ones are skipped with a logged warning. What was found,
    loaded and skipped is kept as ``dynamic_backends`` (a ``DynamicBackendReport``). The
    backends this runtime registered are unregistered when it closes (the end of its
    ``async with``); an id that was already registered is skipped, never replaced.

    Backend contexts: the first load that uses a backend with ``create_context(options)``
    makes its context from this runtime's ``RuntimeOptions`` (``opencl_device`` picks
    GpuAcc's device, else ``FLOWRT_OPENCL_DEVICE``, else the first GPU) and starts the
    context's ``run`` task (GpuAcc's queue actors) in the runtime's nursery; they stop when
    the runtime closes. GpuAcc tunes its kernels' local work sizes at load unless
    ``tuning_mode`` is "none" (the default; "rapid", "normal" and "exhaustive" time more
    candidates), reading ``tuning_file`` first when it exists and writing what it tuned back
    to it: with a tuning file, runs use the sizes in it and nothing is timed again.
    A backend whose memory is not host memory (capability ``host_memory``
    False) and whose context runs device segments (``submit``) runs on its device: its
    tensors stay there between its workloads. The runtime holds its contexts for its
    lifetime; each context's ``before_load``/``after_load`` and ``before_unload``/
    ``after_unload`` hooks are called with the network id around each load and ``unload``
    (see ``flowrt.registry.contexts``).

    ``allocators`` (``{backend id: Allocator}``, see ``flowrt.engine.memory.allocator``)
    makes a backend take its arenas from the user's allocator, as Arm NN's
    CustomMemoryAllocator; BackendError for a backend not registered or whose capabilities
    do not allow it (``custom_allocator``).

    ``memory_budget`` (bytes; None: half the machine's physical memory) bounds the memory
    arenas of the networks this runtime holds loaded (every pool, every backend): a load
    whose arenas would pass it, or one of whose layers has an output larger than it, raises
    ResourceError naming the layer and the bytes, before anything is allocated.
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
        opencl_device: str | None = None,
        tuning_file: str | os.PathLike[str] | None = None,
        tuning_mode: str = "none",
        allocators: Mapping[str, Any] | None = None,
        memory_budget: int | None = None,
    ) -> None:
        where = "Runtime"
        self.registry = backend_registry() if registry is None else registry
        check_instance(
            "registry", self.registry, BackendRegistry, "a flowrt.BackendRegistry or None", where=where
        )
        self.cpu_workers = (
            default_cpu_workers()
            if cpu_workers is None
            else check_int("cpu_workers", cpu_workers, maximum=MAX_CPU_WORKERS, where=where)
        )
        self.zero_memory_on_release = check_bool(
            "zero_memory_on_release", zero_memory_on_release, where=where
        )
        self.profiling = check_bool("profiling", profiling, where=where)
        self.priority_aging = check_seconds(
            "priority_aging", priority_aging, maximum=MAX_PRIORITY_AGING, where=where
        )
        self.parallel_branches = check_bool("parallel_branches", parallel_branches, where=where)
        self.memory_budget = check_memory_budget(memory_budget, where)
        self.options = _runtime_options(opencl_device, tuning_file, tuning_mode)
        if backend_paths is not None:
            backend_paths = check_paths("backend_paths", backend_paths, where=where)
        if allocators is not None:
            check_instance(
                "allocators", allocators, Mapping, "a mapping {backend id: Allocator} or None", where=where
            )
        self._workers: CpuWorkerPool | None = None
        self._backends: dict[str, Backend] = {}  # one configured object per backend id
        self._contexts: dict[str, Any] = {}
        self._stack: contextlib.AsyncExitStack | None = None
        self._nursery: trio.Nursery | None = None
        self._aio: AsyncioBridge | None = None  # entered under asyncio: the trio thread it runs in
        # Loaded last, so a bad argument above never leaves backends registered.
        self.dynamic_backends = load_dynamic_backends(self.registry, backend_paths)
        self._owns_dynamic_backends = True
        try:
            self.allocators = check_allocators(allocators, self.registry)
        except FlowrtError:
            self._unload_dynamic_backends()
            raise
        self._loaded: dict[int, LoadedNetwork] = {}
        self._network_ids = itertools.count()

    async def __aenter__(self) -> Runtime:
        if async_library() != "trio":
            # Entered again, under trio, in the bridge's own thread.
            self._aio = await AsyncioBridge.start(self)
            return self
        try:
            pool = CpuWorkerPool(self.cpu_workers, aging_interval=self.priority_aging)
            self._workers = await pool.__aenter__()
        except BaseException:
            # Its __aexit__ will not run: give back what __init__ registered (the pool has
            # stopped the threads it started).
            self._unload_dynamic_backends()
            raise
        self._stack = contextlib.AsyncExitStack()
        # Backend contexts' tasks (GpuAcc's queue actors) live here, started on first use.
        self._nursery = await self._stack.enter_async_context(trio.open_nursery())
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        if self._aio is not None and async_library() != "trio":
            try:
                await self._aio.close()  # exits the runtime in its trio thread
            finally:
                self._aio = None
            return
        # Each step runs however the one before it ended, cancellation included: a nursery
        # left open, or threads not joined, would outlive the block (trio's "Nursery stack
        # corrupted"). The waits are bounded (see ``_unload_all`` and ``CpuWorkerPool``), and
        # a cancellation goes on once the last step is done.
        workers, self._workers = self._workers, None
        stack, self._stack = self._stack, None
        try:
            await self._unload_all()
        finally:
            try:
                await self._close_contexts(stack)
            finally:
                self._backends.clear()
                try:
                    if workers is not None:
                        await workers.__aexit__(*exc_info)
                finally:
                    self._unload_dynamic_backends()

    async def _unload_all(self) -> None:
        """Unload every network still loaded. All refuse new runs first, so that their runs
        in flight end together; each unload runs to its end even when cancelled (bounded:
        see ``LoadedNetwork._release``), and the cancellation goes on after the last."""
        models = list(self._loaded.values())
        for model in models:
            model.unloaded = True
        cancelled: trio.Cancelled | None = None
        for model in models:
            try:
                await self.unload(model)
            except trio.Cancelled as e:
                cancelled = cancelled or e
        if cancelled is not None:
            raise cancelled

    async def _close_contexts(self, stack: contextlib.AsyncExitStack | None) -> None:
        """Close the backend contexts, then the nursery their tasks run in (always: its tasks
        end once their contexts are closed, or are cancelled with the block)."""
        try:
            for context in self._contexts.values():
                if hasattr(context, "close"):
                    context.close()
        finally:
            self._contexts.clear()
            self._nursery = None
            if stack is not None:
                # Not handed the body's exception: the nursery would wrap it in an exception
                # group.
                await stack.aclose()

    def _unload_dynamic_backends(self) -> None:
        """Unregister the dynamic backends this runtime registered (once), as Arm NN does when
        its runtime is destroyed."""
        if self._owns_dynamic_backends:
            self._owns_dynamic_backends = False
            unload_dynamic_backends(self.registry, self.dynamic_backends)

    async def load(
        self,
        optimized: OptimizedNetwork,
        *,
        max_in_flight: int | None = None,
        batch: int | None = None,
        progress: bool | None = None,
        hint: str | None = None,
    ) -> LoadedNetwork:
        """Build and prepare every workload and plan memory; heavy one-time work happens here.

        ``max_in_flight`` memory pools (default: the runtime's ``cpu_workers``): that many
        runs of this network execute at once, each in its own memory. All of them are held to
        the memory budget here; the first ``flowrt.engine.memory.pool.EAGER_POOLS`` are
        allocated here, any more when runs first need them (a huge ``max_in_flight`` costs
        only what runs in flight at once use). ``batch`` re-shapes a network exported for a
        batch of 1 to run that many samples per run (as OpenVINO's ``model.reshape``; see
        ``flowrt.set_batch``): every input's leading dim becomes ``batch``, weights are
        shared; ShapeError when the network cannot be re-batched. ``progress=True`` shows a
        progress bar on stderr over the layers as they are prepared (CpuAcc compiles its
        kernels then: tens of seconds for a large model with a cold numba cache), once the load
        has run a second (see ``flowrt.progress``); None (the default) means False, unless the
        ``flowrt`` command line asked for it. ``hint`` ("latency" or "throughput", see
        ``flowrt.hints``) becomes the default of the model's streams; with "throughput" the
        model's cost is measured here (or read from the cache)."""
        if self._aio is not None and async_library() != "trio":
            load = functools.partial(
                self.load, optimized, max_in_flight=max_in_flight, batch=batch, progress=progress, hint=hint
            )
            return AioLoadedNetwork(await self._aio.call(load), self._aio)
        if self._workers is None:
            raise FlowrtError("Runtime.load needs an active runtime: use 'async with Runtime() as rt'")
        assert self._nursery is not None  # opened with the workers
        where = "Runtime.load"
        check_instance(
            "optimized",
            optimized,
            OptimizedNetwork,
            "an OptimizedNetwork (from flowrt.optimize)",
            where=where,
        )
        pools = (
            self.cpu_workers
            if max_in_flight is None
            else check_int("max_in_flight", max_in_flight, where=where)
        )
        batch = None if batch is None else check_int("batch", batch, where=where)
        hint = check_hint(hint, where)
        for bid in self._backends_of(optimized):
            await self._start_context(bid)
        shaped = optimized
        if batch is not None:
            shaped = await trio.to_thread.run_sync(set_batch, optimized, batch, self.registry)
        network_id = next(self._network_ids)
        call_hooks(self._contexts, "before_load", network_id)
        # On a CPU worker, as runs are: warming a layer up enters numba's parallel regions, and
        # an OpenMP team started in any other thread would outlive the load and make every
        # later region slower to enter (libgomp stops spinning once its threads outnumber
        # the cores).
        show = load_progress.get() if progress is None else progress
        layers = sum(layer.kind not in ("Constant", "Input", "Output") for layer in shaped.graph)
        async with layer_progress(self._nursery, layers, show) as prepared:
            model = await self._workers.run_sync(self._build, shaped, pools, prepared)
        model.batch, model.unbatched, model._runtime = batch, optimized, self
        model.network_id = network_id
        self._loaded[network_id] = model
        call_hooks(self._contexts, "after_load", network_id)
        model.hint = hint
        if hint == "throughput":
            await choose(model, hint)
        return model

    async def unload(self, model: LoadedNetwork) -> None:
        """Unload a network this runtime loaded: later runs raise FlowrtError, runs in flight
        finish first, then its memory pools are released. Cancelled, it still finishes (it
        waits for the runs in flight ``flowrt.loaded_network.UNLOAD_GRACE`` seconds at
        most), then raises the Cancelled. Backend contexts' ``before_unload``
        and ``after_unload`` hooks are called around it with the network id. The runtime's
        close unloads the networks still loaded."""
        if self._aio is not None and async_library() != "trio":
            return await self._aio.call(self.unload, trio_side(model))
        network_id = model.network_id
        if network_id is None or self._loaded.get(network_id) is not model:
            raise FlowrtError(
                f"Runtime.unload expects a network loaded by this runtime and not yet unloaded; "
                f"network {network_id} is {'unloaded' if model.unloaded else 'not one of them'}"
            )
        call_hooks(self._contexts, "before_unload", network_id)
        del self._loaded[network_id]
        try:
            await model._release()  # runs to its end, cancelled or not
        finally:
            call_hooks(self._contexts, "after_unload", network_id)

    @staticmethod
    def _backends_of(optimized: OptimizedNetwork) -> list[str]:
        return list(dict.fromkeys(layer.backend for layer in optimized.graph if layer.backend))

    def _backend(self, bid: str) -> Backend:
        """This runtime's object for backend ``bid`` (made once, so a context's choices stick)."""
        if bid not in self._backends:
            self._backends[bid] = self.registry.get(bid)
        return self._backends[bid]

    async def _start_context(self, bid: str) -> None:
        """Make backend ``bid``'s context on first use and start its task, if it has them."""
        backend = self._backend(bid)
        if bid in self._contexts or not hasattr(backend, "create_context"):
            return
        try:
            context = backend.create_context(self.options)
        except FlowrtError:
            raise
        except Exception as e:
            raise BackendError(f"backend {bid} failed to create its context: {e}") from e
        if hasattr(context, "run"):
            assert self._nursery is not None  # load runs in an active runtime
            await self._nursery.start(context.run)
        self._contexts[bid] = context

    def _device_runners(self, bids: Any) -> dict[str, DeviceRunner]:
        """The backends among ``bids`` whose workloads run on a device, with their runners."""
        runners: dict[str, DeviceRunner] = {}
        for bid in bids:
            context = self._contexts.get(bid)
            on_host = self._backend(bid).capabilities.get("host_memory", True)
            if not on_host and context is not None and hasattr(context, "submit"):
                runners[bid] = context
        return runners

    @collection_paused()
    def _build(self, optimized: OptimizedNetwork, pool_count: int, progress: LoadProgress) -> LoadedNetwork:
        factories: dict[str, Any] = {}
        managers: dict[str, MemoryManager] = {}
        devices = self._device_runners(self._backends_of(optimized))
        # This load's job on the CPU worker: the workloads that take a job's context warm up
        # in it, planning as a run with as many threads would.
        job = job_context()
        weights = WeightsRecord()

        def make_workload(layer: Layer, info: WorkloadInfo):
            bid = layer.backend
            assert bid is not None  # the optimizer assigns every compute layer a backend
            if bid not in factories:
                backend = self._backend(bid)
                managers[bid] = backend.create_memory_manager() or MemoryManager()
                if bid in self.allocators:  # Runtime(allocators=...): arenas from the user's
                    managers[bid].allocator = self.allocators[bid]
                factories[bid] = backend.create_workload_factory(managers[bid])
            progress.begin(layer.name)
            try:
                with recording(weights, bid):  # the transformed weights it takes, shared or made
                    workload = factories[bid].create_workload(info)
                    if getattr(workload, "takes_job", False):
                        workload.prepare(job)
                    else:
                        workload.prepare()
            except FlowrtError:
                raise
            except Exception as e:
                raise BackendError(
                    f"backend {bid} failed to build layer {layer.name!r} ({layer.kind}): {e}"
                ) from e
            progress.end()
            return workload

        held = sum(model.pools.nbytes for model in list(self._loaded.values()))
        budget = MemoryBudget(
            self.memory_budget, "Runtime(memory_budget=...)", held, "networks loaded before"
        )
        check_layer_outputs(optimized.graph, budget)
        with contextlib.ExitStack() as ahead:
            for bid in self._backends_of(optimized):
                compile_ahead = getattr(self._backend(bid), "compile_ahead", None)
                if compile_ahead is not None:
                    ahead.enter_context(compile_ahead(optimized, job))
            options = optimized.options
            dataflow = build_dataflow(
                optimized.graph,
                make_workload,
                parallel_branches=self.parallel_branches,
                device_backends=frozenset(devices),
                fast_math=options.fast_math,
                fp16_weights=options.reduce_fp32_to_fp16,
            )
        order = [PlannedNode.of(n) for n in dataflow.order]
        layout = plan_memory(order, dataflow.tensor_infos, set(dataflow.outputs.values()), managers)
        arena_bytes = {b: plan.arena_bytes for b, plan in layout.plans.items()}
        allocators = {b: managers[b].allocator for b in arena_bytes}
        claim_arenas(budget, layout.plans, dataflow.order, pool_count)
        pools = PoolManager(
            pool_count,
            arena_bytes,
            allocators,
            zero_on_release=self.zero_memory_on_release,
            aging_interval=self.priority_aging,
            eager=EAGER_DEVICE_POOLS if devices else EAGER_POOLS,
        )
        assert self._workers is not None  # load checked the runtime is active
        model = LoadedNetwork(optimized, dataflow, self._workers, layout, pools, self.profiling, devices)
        model.weights = weights
        return model
