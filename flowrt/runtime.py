"""Runtime and LoadedNetwork: load an optimized network, then ``await model.run(feeds)``.

::

    async with flowrt.Runtime() as rt:
        model = await rt.load(flowrt.optimize(net, backends=["CpuRef"]))
        outputs = await model.run({"data": x})
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from typing import Any

import numpy as np
import trio

from flowrt.engine.graph.graph import Layer
from flowrt.engine.graph.optimizer import OptimizedNetwork
from flowrt.engine.scheduler.dataflow import Dataflow, build_dataflow
from flowrt.engine.scheduler.executor import execute
from flowrt.engine.scheduler.feeds import check_feeds
from flowrt.errors import BackendError, FlowrtError
from flowrt.registry import BackendRegistry, WorkloadInfo, backend_registry
from flowrt.types import Priority, TensorInfo

logger = logging.getLogger(__name__)


def default_cpu_workers() -> int:
    """The number of cores this process may use."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not every platform has affinity
        return os.cpu_count() or 1


class LoadedNetwork:
    """A network ready to run: workloads built and prepared, dataflow compiled.

    ``run`` may be awaited from any trio run; concurrent runs of one model are allowed.
    """

    def __init__(
        self, optimized: OptimizedNetwork, dataflow: Dataflow, limiter: trio.CapacityLimiter
    ) -> None:
        self.optimized = optimized
        self.dataflow = dataflow
        self._limiter = limiter

    @property
    def inputs(self) -> dict[str, TensorInfo]:
        """Input name -> expected info, in the network's order."""
        return dict(self.dataflow.input_infos)

    @property
    def outputs(self) -> dict[str, TensorInfo | None]:
        """Output name -> inferred info, in the network's order."""
        return dict(self.dataflow.output_infos)

    async def run(
        self, feeds: Mapping[str, Any], *, priority: Priority = Priority.MEDIUM
    ) -> dict[str, np.ndarray]:
        """Run once; returns ``{output name: array}`` (arrays the caller owns).

        Feeds are checked first (InputError, DataTypeError, ShapeError); a failing workload
        raises RunError. Cancelling the calling scope stops the run at the next workload.
        ``priority`` orders runs where backends queue work; CpuRef runs everything as it comes.
        """
        arrays = check_feeds(self.dataflow.input_infos, feeds)
        return await execute(self.dataflow, arrays, self._limiter)


class Runtime:
    """Owns the backend registry and the worker capacity; loads optimized networks.

    Use as ``async with Runtime() as rt``. ``cpu_workers`` bounds how many segments run at once
    (default: the cores this process may use).
    """

    def __init__(self, registry: BackendRegistry | None = None, *, cpu_workers: int | None = None) -> None:
        self.registry = registry or backend_registry()
        self.cpu_workers = cpu_workers or default_cpu_workers()
        if self.cpu_workers < 1:
            raise FlowrtError(f"cpu_workers must be at least 1, got {self.cpu_workers}")
        self._limiter: trio.CapacityLimiter | None = None

    async def __aenter__(self) -> Runtime:
        self._limiter = trio.CapacityLimiter(self.cpu_workers)
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        self._limiter = None

    async def load(self, optimized: OptimizedNetwork) -> LoadedNetwork:
        """Build and prepare every workload; heavy one-time work happens here, not per run."""
        if self._limiter is None:
            raise FlowrtError("Runtime.load needs an active runtime: use 'async with Runtime() as rt'")
        if not isinstance(optimized, OptimizedNetwork):
            raise FlowrtError(
                f"Runtime.load expects an OptimizedNetwork (from flowrt.optimize), got {type(optimized).__name__}"
            )
        dataflow = await trio.to_thread.run_sync(self._build, optimized)
        return LoadedNetwork(optimized, dataflow, self._limiter)

    def _build(self, optimized: OptimizedNetwork) -> Dataflow:
        factories: dict[str, Any] = {}

        def make_workload(layer: Layer, info: WorkloadInfo):
            bid = layer.backend
            if bid not in factories:
                backend = self.registry.get(bid)  # type: ignore[arg-type]
                factories[bid] = backend.create_workload_factory(backend.create_memory_manager())  # type: ignore[index]
            try:
                workload = factories[bid].create_workload(info)  # type: ignore[index]
                workload.prepare()
            except FlowrtError:
                raise
            except Exception as e:
                raise BackendError(
                    f"backend {bid} failed to build layer {layer.name!r} ({layer.kind}): {e}"
                ) from e
            return workload

        return build_dataflow(optimized.graph, make_workload)
