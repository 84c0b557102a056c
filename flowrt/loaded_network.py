"""LoadedNetwork: a network loaded by a ``Runtime``, ready for ``await model.run(feeds)``,
``model.stream()`` and ``model.profile()``; its runs take a memory pool each and cross to
the runtime's host runner (its CPU workers) once per segment, and to its device runners (see
``flowrt.engine.scheduler.executor``)."""

from __future__ import annotations

import itertools
import logging
import numbers
from collections.abc import Collection, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import attrs
import numpy as np
import trio

from flowrt.engine.graph.optimizer import OptimizedNetwork
from flowrt.engine.memory.planner import MemoryLayout
from flowrt.engine.memory.pool import PoolManager
from flowrt.engine.memory.weights import WeightsRecord
from flowrt.engine.scheduler.dataflow import Dataflow, host_reads
from flowrt.engine.scheduler.device_array import DeviceArray
from flowrt.engine.scheduler.executor import Binding, DeviceRunner, HostRunner, execute
from flowrt.engine.scheduler.feeds import check_feeds, check_output_buffers
from flowrt.engine.scheduler.outputs import large_outputs
from flowrt.errors import BackendError, FlowrtError, InputError, ShapeError
from flowrt.hints import Costs, check_hint
from flowrt.profiling import ProfileRecord
from flowrt.stream import BatchingStream, HintedStream, Stream, request_rows
from flowrt.types import Priority, TensorInfo, static_dims
from flowrt.validate import argument_error, check_bool, check_int, check_priority, check_seconds

if TYPE_CHECKING:
    from flowrt.runtime import Runtime

logger = logging.getLogger(__name__)

# Seconds a cancelled unload (or runtime close) still waits for the runs in flight.
UNLOAD_GRACE = 10.0


def _bindings(dataflow: Dataflow, layout: MemoryLayout) -> dict[int, Binding]:
    bindings = {}
    for backend, plan in layout.plans.items():
        for tid, placement in plan.placements.items():
            info = dataflow.tensor_infos[tid]
            shape = static_dims(info.shape)  # the planner places tensors of known size only
            bindings[tid] = Binding(backend, placement.offset, shape, info.dtype.numpy)
    return bindings


class LoadedNetwork:
    """A network ready to run: workloads built and prepared, dataflow compiled, memory planned.

    ``run`` may be awaited from any trio run; a runtime entered under asyncio returns its
    asyncio face instead (``flowrt.aio.AioLoadedNetwork``, the same API). Up to ``max_in_flight`` runs execute at once,
    each in a pool of its own; further runs wait for a pool. Its host segments run on
    ``host`` (the runtime's CPU worker pool), its device segments on ``devices``.
    """

    def __init__(
        self,
        optimized: OptimizedNetwork,
        dataflow: Dataflow,
        host: HostRunner,
        layout: MemoryLayout,
        pools: PoolManager,
        profiling: bool = False,
        devices: Mapping[str, DeviceRunner] | None = None,
    ) -> None:
        self.optimized = optimized
        self.dataflow = dataflow
        self.layout = layout
        self.pools = pools
        self._host = host
        self._devices = dict(devices or {})
        self._bindings = _bindings(dataflow, layout)
        self._large_outputs = large_outputs(dataflow, self._bindings)
        self._reads_on_host: frozenset[int] | None = None
        self.profiling = profiling
        self._records: list[ProfileRecord] = []
        self._runs = itertools.count()
        # the transformed weights its layers took at load (set by Runtime.load)
        self.weights = WeightsRecord()
        # Set by Runtime.load: the batch asked for (None: as exported), the network before
        # re-batching (what other batch sizes are made from), and the runtime that loads them.
        self.batch: int | None = None
        self.unbatched = optimized
        self._runtime: Runtime | None = None
        self._batched: dict[int, LoadedNetwork] = {}
        # The performance hint it was loaded with, and what the throughput hint measured.
        self.hint: str | None = None
        self.measured_costs: Costs | None = None
        # Set by Runtime.load; unload() makes runs raise, waits for those in flight, frees pools.
        self.network_id: int | None = None
        self.unloaded = False
        self._in_flight = 0
        self._drained: trio.Event | None = None

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
        device_outputs: bool | Collection[str] = False,
    ) -> dict[str, Any]:
        """Run once; returns ``{output name: array}`` — arrays the caller owns, never pool memory.

        Feeds are checked first (InputError, DataTypeError, ShapeError) and read in place; a
        feed may be a :class:`DeviceArray` of this network's device (:meth:`device_array`),
        which its device layers read where it is (no upload). ``device_outputs`` (True: every
        output; or output names) keeps those outputs on the device: each one a device layer
        makes comes back as a new DeviceArray (a copy within the device, no download); one
        made on the host stays a numpy array.
        ``outputs`` binds caller arrays (ONNX Runtime's IOBinding): those outputs are written
        into them, and they are what is returned. An output no layer reads, bound to a
        C-contiguous array that shares no memory with a feed, is written there by the layer
        that produces it (or downloaded there from the device), with no copy. A failing workload raises RunError.
        Cancelling the calling scope stops the run at the next workload. The run's memory
        pool is awaited by ``priority`` (first come, first served within one) and given
        back however the run ends. ``profile`` (default: the runtime's ``profiling``) records
        each workload's timing; :meth:`profile` returns the records. On a device backend
        (GpuAcc) ``priority`` also picks the queue the run's GPU segments are enqueued on.
        ``priority`` is a ``Priority``, its value or its name ("high"); ArgumentError otherwise.
        """
        priority = check_priority(priority, where="LoadedNetwork.run")
        if profile is not None:
            profile = check_bool("profile", profile, where="LoadedNetwork.run")
        if self.unloaded:
            raise FlowrtError(f"network {self.network_id} was unloaded; load it again to run it")
        arrays = check_feeds(self.dataflow.input_infos, feeds)
        bound = check_output_buffers(self.dataflow.output_infos, outputs)
        kept = self._device_outputs(device_outputs, bound)
        for name, array in arrays.items():
            if isinstance(array, DeviceArray) and not any(r.holds(array) for r in self._device_runners()):
                raise InputError(
                    f"input {name!r} is a DeviceArray of a device network {self.network_id} does not run "
                    f"on; feed a numpy array, or one of this network's device_array()"
                )
        record = (
            self._recorder(next(self._runs)) if (self.profiling if profile is None else profile) else None
        )
        self._in_flight += 1
        try:
            async with self.pools.acquire(int(priority)) as pool:
                results = await execute(
                    self.dataflow,
                    arrays,
                    self._host,
                    pool,
                    self._bindings,
                    record,
                    devices=self._devices,
                    priority=int(priority),
                    outputs=bound,
                    large=self._large_outputs,
                    device_outputs=kept,
                    reads_on_host=self._host_reads(),
                )
        finally:
            self._in_flight -= 1
            if self._in_flight == 0 and self._drained is not None:
                self._drained.set()
        return results

    def _device_outputs(self, asked: Any, bound: Mapping[str, np.ndarray]) -> frozenset[int]:
        """The tensor ids of the outputs ``run(device_outputs=asked)`` keeps on the device."""
        where = "LoadedNetwork.run"
        if isinstance(asked, bool):
            names = list(self.dataflow.outputs) if asked else []
        elif isinstance(asked, Collection) and not isinstance(asked, str | bytes):
            names = list(asked)
            unknown = [n for n in names if n not in self.dataflow.outputs]
            if unknown:
                raise InputError(
                    f"device_outputs names unknown output {unknown[0]!r}; the network's outputs are: "
                    f"{', '.join(self.dataflow.outputs)}"
                )
        else:
            raise argument_error("device_outputs", "a bool or a collection of output names", asked, where)
        if names and not self._device_runners():
            raise BackendError(
                f"{where}: device_outputs, but network {self.network_id} runs no layer on a device; its "
                f"layers run on {', '.join(sorted(set(self.optimized.assignments().values())))}"
            )
        both = [n for n in names if n in bound and asked is not True]
        if both:
            raise argument_error(
                "device_outputs", "outputs not also bound to arrays with outputs=", both[0], where
            )
        return frozenset(self.dataflow.outputs[n] for n in names if n not in bound)

    def _device_runners(self) -> list[Any]:
        """The device runners that hold DeviceArrays (GpuAcc's)."""
        return [r for r in self._devices.values() if hasattr(r, "holds")]

    def _host_reads(self) -> frozenset[int]:
        """The tensors the host reads in a run (worked out once)."""
        if self._reads_on_host is None:
            self._reads_on_host = host_reads(self.dataflow)
        return self._reads_on_host

    def device_array(self, array: Any) -> DeviceArray:
        """A copy of ``array`` in the memory of the device this network's GpuAcc layers run on,
        to feed runs with no upload (ONNX Runtime's IOBinding of a device input, a tensor
        PyTorch keeps on its GPU). It stands for ``array``'s dtype and shape as a feed is
        checked; ``numpy()`` copies it back. Blocks until the copy is done.

        BackendError where none of the network's layers runs on such a device; ArgumentError
        for something numpy cannot make an array of.
        """
        where = "LoadedNetwork.device_array"
        try:
            host = np.asarray(array)
        except (TypeError, ValueError) as e:
            raise argument_error("array", "an array", array, where) from e
        runners = self._device_runners()
        if not runners:
            raise BackendError(
                f"{where}: network {self.network_id} runs no layer on a device with memory of its own "
                f"(GpuAcc); its layers run on {', '.join(sorted(set(self.optimized.assignments().values())))}"
            )
        return runners[0].device_array(host)

    def pinned_array(self, shape: Any, dtype: Any = np.float32) -> np.ndarray:
        """A new array (uninitialized, C-contiguous) in page-locked host memory of the device
        this network's GpuAcc layers run on, for feeds and for outputs bound with
        ``outputs=``: GpuAcc uploads such a feed straight from it and downloads such an output
        straight into it, where an ordinary array crosses through a copy into the run's pinned
        staging memory (4.8 MB for a batch of eight 224x224 images: about 0.45 ms of an H200
        host's time an upload). The memory stays page-locked while the array, or a view of
        it, lives. Do not write a feed's array while a run that reads it is in flight.

        BackendError where none of the network's layers runs on such a device; ArgumentError
        for a shape that is not a sequence of ints >= 0 or a dtype numpy does not know.
        """
        where = "LoadedNetwork.pinned_array"
        if isinstance(shape, numbers.Integral) and not isinstance(shape, bool):
            shape = (shape,)
        if isinstance(shape, str | bytes) or not isinstance(shape, Sequence):
            raise argument_error("shape", "a sequence of ints >= 0", shape, where)
        dims = tuple(check_int("shape", d, minimum=0, where=where) for d in shape)
        try:
            kind = np.dtype(dtype)
        except TypeError:
            raise argument_error("dtype", "a numpy dtype", dtype, where) from None
        runners = [r for r in self._devices.values() if hasattr(r, "pinned_array")]
        if not runners:
            raise BackendError(
                f"{where}: network {self.network_id} runs no layer on a device with pinned host "
                f"memory (GpuAcc); its layers run on {', '.join(sorted(set(self.optimized.assignments().values())))}"
            )
        return runners[0].pinned_array(dims, kind)

    def _recorder(self, run: int):
        def record(node, worker: str, start_ns: int, end_ns: int, launches: int = 0) -> None:
            self._records.append(
                ProfileRecord(
                    run, node.layer, node.kind, node.backend, worker, start_ns, end_ns, launches=launches
                )
            )

        return record

    def profile(self, *, clear: bool = False) -> list[ProfileRecord]:
        """The workload records of every profiled run so far (``clear``: and forget them)."""
        records = list(self._records)
        if clear:
            self._records.clear()
        return records

    def stream(
        self,
        *,
        max_in_flight: int | None = None,
        priority: Priority = Priority.MEDIUM,
        max_batch: int | None = None,
        max_delay: float | None = None,
        hint: str | None = None,
        latency_budget: float | None = None,
    ) -> Stream | BatchingStream:
        """A bounded stream of requests, results in submission order (see ``flowrt.stream``).

        ``hint`` ("latency" or "throughput") has the stream choose its settings when it
        opens, from the model's measured cost and the machine (see ``flowrt.hints``;
        ``stream.choice`` says what it chose and why); ``latency_budget`` (seconds) bounds
        what the throughput hint lets a request wait. Arguments given explicitly win over a
        hint's choice. With no hint and none of ``max_in_flight``, ``max_batch`` and
        ``max_delay``, the stream takes the hint the model was loaded with, else
        "throughput" (measured when the first such stream of the network opens on this
        machine, then read from the cache).

        Numbers without a hint: ``max_in_flight`` defaults to the number of memory pools the
        model was loaded with (times ``max_batch``). With ``max_batch`` > 1, requests that arrive
        within ``max_delay`` seconds of the first waiting one are stacked along the batch
        dimension and run as one (see ``BatchingStream``); ShapeError at once when this
        network cannot be re-batched. ``priority`` is a ``Priority``, its value or its name
        ("high").
        """
        where = "LoadedNetwork.stream"
        priority = check_priority(priority, where=where)
        hint = check_hint(hint, where)
        if latency_budget is not None:
            latency_budget = check_seconds("latency_budget", latency_budget, where=where)
        if max_batch is not None:
            max_batch = check_int("max_batch", max_batch, where=where)
        if max_delay is not None:
            # Checked even where unused: infinity would keep a lone request waiting.
            max_delay = check_seconds("max_delay", max_delay, allow_zero=True, where=where)
        if max_in_flight is not None:
            max_in_flight = check_int("max_in_flight", max_in_flight, where=where)
        if hint is None and (max_in_flight, max_batch, max_delay) == (None,) * 3:
            hint = self.hint or "throughput"
        if hint is not None:
            return HintedStream(self, priority, hint, latency_budget, max_in_flight, max_batch, max_delay)
        max_batch = 1 if max_batch is None else max_batch
        if max_batch == 1:
            return Stream(self, self.pools.count if max_in_flight is None else max_in_flight, priority)
        if max_in_flight is None:
            max_in_flight = self.pools.count * max_batch
        return BatchingStream(self, max_in_flight, priority, max_batch, max_delay or 0.0)

    async def batched(self, batch: int) -> LoadedNetwork:
        """This network re-shaped to run ``batch`` samples per run (``flowrt.set_batch``), loaded
        by the same runtime with as many pools; built on first use, then kept. Raises ShapeError
        when the network cannot be re-batched."""
        batch = check_int("batch", batch, where="LoadedNetwork.batched")
        if batch == self.batch:
            return self
        if batch not in self._batched:
            if self._runtime is None:
                raise FlowrtError("re-batching needs the network to be loaded by Runtime.load")
            self._batched[batch] = await self._runtime.load(
                self.unbatched, max_in_flight=self.pools.count, batch=batch
            )
        return self._batched[batch]

    @property
    def batched_models(self) -> dict[int, LoadedNetwork]:
        """The batch-size variants loaded so far (``batched``), by batch."""
        return dict(self._batched)

    async def drop_batched(self, *, larger_than: int) -> None:
        """Unload the batch sizes ``batched`` made of more than ``larger_than`` samples."""
        for batch in [b for b in self._batched if b > larger_than]:
            await self._batched.pop(batch).unload()

    def request_rows_or_1(self) -> int:
        """The leading dim of one request (1 where the inputs have no common fixed one)."""
        try:
            return request_rows(self.inputs)
        except ShapeError:
            return 1

    async def unload(self) -> None:
        """Unload this network from the runtime that loaded it (see ``Runtime.unload``)."""
        if self._runtime is None:
            raise FlowrtError("unload needs a network loaded by Runtime.load")
        await self._runtime.unload(self)

    async def _release(self) -> None:
        """Refuse new runs, wait for the runs in flight, then let go of the memory pools.

        Cancelled while it waits, it waits on, shielded, for at most ``UNLOAD_GRACE`` seconds
        (runs cancelled too stop at their next workload), lets go all the same (a run still in
        flight gives its pool back to the manager it took it from; logged) and then raises
        the Cancelled: an unload never stops halfway.
        """
        self.unloaded = True
        try:
            await self._wait_drained()
        except trio.Cancelled:
            with trio.move_on_after(UNLOAD_GRACE, shield=True) as grace:
                await self._wait_drained()
            if grace.cancelled_caught:
                logger.warning(
                    "network %s: %d run(s) still in flight %s s after its unload was cancelled; "
                    "unloaded without waiting for them",
                    self.network_id,
                    self._in_flight,
                    UNLOAD_GRACE,
                )
            raise
        finally:
            self.pools = PoolManager(0, {}, {})

    async def _wait_drained(self) -> None:
        """Wait until no run is in flight (new ones are refused by then)."""
        while self._in_flight:
            self._drained = trio.Event()
            await self._drained.wait()

    def memory_report(self) -> dict[str, dict[str, int]]:
        """Per backend: ``arena_bytes`` (one pool), ``no_reuse_bytes`` (all intermediate
        tensors summed), ``lower_bound_bytes`` (largest total live at one step of the
        schedule) and ``tensors`` (how many were planned); and the weights its kernels read
        in a form of their own (packed panels, Winograd transforms): ``weights_bytes``, made
        by this load, and ``shared_weights_bytes``, found made by an earlier load of the same
        constants (another load of this network, another batch size, another runtime) and
        shared with it (see ``flowrt.engine.memory.weights``)."""
        report = {b: attrs.asdict(m) for b, m in self.layout.report.items()}
        for backend in {*self.weights.own, *self.weights.shared}:
            report.setdefault(backend, {})
        for backend, figures in report.items():
            figures["weights_bytes"] = self.weights.own.get(backend, 0)
            figures["shared_weights_bytes"] = self.weights.shared.get(backend, 0)
        return report
