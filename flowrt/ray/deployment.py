"""The replicas of a Ray pipeline's stages, from start to end, on the driver's trio loop.

``Deployment`` is an async context manager: entering it puts each model in Ray's object store
once, starts every stage's replicas (Ray actors placed as their ``Stage`` says) and waits until
each has loaded its model; leaving it kills them. Between the two, its ``pipeline`` (a
``flowrt.Pipeline`` whose model stages are ``RayStageCall``s) runs requests, and a nursery
holds the tasks that watch replicas being restarted.
"""

from __future__ import annotations

import inspect
import logging
import pickle
from collections.abc import Mapping, Sequence
from typing import Any

import attrs
import ray
import trio

from flowrt.aio import AsyncioBridge
from flowrt.errors import ArgumentError, FlowrtError, ResourceError
from flowrt.nursery import open_nursery
from flowrt.pipeline import Pipeline, stage_call
from flowrt.ray.refs import resolve
from flowrt.ray.replica import ModelReplicaActor, ReplicaReport
from flowrt.ray.replicas import RayStageCall, RemoteOutputs, Replica
from flowrt.ray.stage import ModelPayload, Stage
from flowrt.types import Priority

logger = logging.getLogger(__name__)


@attrs.define(eq=False)
class LocalStage:
    """A function stage of a Ray pipeline: it runs on the driver, as in a local pipeline
    (``flowrt.pipeline``), on the outputs brought from the object store. Under asyncio an
    async function runs as a task of the caller's loop (``bridge``)."""

    name: str
    function: Any
    wants_feeds: bool
    bridge: AsyncioBridge | None = None
    concurrency: int = 1

    async def __call__(self, values: Any, feeds: Mapping[str, Any], priority: Priority) -> Any:
        if isinstance(values, RemoteOutputs):
            values = await values.fetch()
        result = self.function(values, feeds) if self.wants_feeds else self.function(values)
        if inspect.isawaitable(result):
            return await (self.bridge.in_caller_loop(result) if self.bridge is not None else result)
        return result


class Deployment:
    """The trio side of a ``flowrt.ray.Pipeline`` (see the module doc)."""

    def __init__(
        self,
        stages: Sequence[Stage | Any],
        names: Sequence[str] | None,
        priority: Priority,
        start_timeout: float,
    ) -> None:
        self.stages = list(stages)
        self.names = names
        self.priority = priority
        self.start_timeout = start_timeout
        self.calls: list[Any] = []
        self.pipeline: Pipeline | None = None
        self._actors: list[Any] = []
        self._networks: list[Any] = []  # the models in Ray's object store, one per stage

    def _name(self, index: int, stage: Any) -> str:
        if self.names is not None:
            return self.names[index]
        if isinstance(stage, Stage) and stage.name is not None:
            return stage.name
        return f"{index}: model"

    async def __aenter__(self) -> Deployment:
        if not ray.is_initialized():
            raise FlowrtError(
                "flowrt.ray.Pipeline needs a Ray cluster: call ray.init(address=...) before entering it"
            )
        self._nursery_manager = open_nursery()
        self._nursery = await self._nursery_manager.__aenter__()
        try:
            self.calls = await self._start()
        except BaseException as e:
            self._kill()
            self._nursery.cancel_scope.cancel()
            await self._nursery_manager.__aexit__(type(e), e, e.__traceback__)
            raise
        self.pipeline = Pipeline.of_calls(self.calls, self.priority)
        return self

    async def __aexit__(self, *exc_info: Any) -> bool | None:
        self._nursery.cancel_scope.cancel()  # the watches over restarting replicas
        self._kill()
        return await self._nursery_manager.__aexit__(*exc_info)

    def _kill(self) -> None:
        for actor in self._actors:
            ray.kill(actor, no_restart=True)
        self._actors, self._networks = [], []

    @staticmethod
    def _put(name: str, payload: ModelPayload) -> Any:
        """``payload`` in Ray's object store; ArgumentError when a network will not pickle."""
        try:
            return ray.put(payload)
        except (pickle.PicklingError, RecursionError) as e:
            raise ArgumentError(
                f"stage {name!r}: the network cannot be pickled to reach the replicas ({e}); give the "
                "model as an ONNX or .flowrt file (a path or bytes), which travels as its bytes"
            ) from e

    async def _start(self) -> list[Any]:
        """Every stage's call; the replicas started and loaded, all stages at once."""
        calls: list[Any] = []
        pending: list[tuple[Stage, str, list[Replica]]] = []
        for i, stage in enumerate(self.stages):
            name = self._name(i, stage)
            if isinstance(stage, Stage):
                # Put once, for every replica; passed inside a list, so that each replica fetches
                # it itself, also when Ray restarts it (this deployment holds the reference).
                network = self._put(name, await trio.to_thread.run_sync(stage.payload))
                self._networks.append(network)
                replicas = []
                for j in range(stage.replicas):
                    actor = ModelReplicaActor.options(**stage.actor_options(j)).remote(
                        [network], stage.backends, stage.cpu_workers, stage.pools
                    )
                    self._actors.append(actor)
                    replicas.append(Replica(name, j, actor))
                last = i == len(self.stages) - 1
                fetch = last or not isinstance(self.stages[i + 1], Stage)
                calls.append(RayStageCall(name, replicas, stage.per_replica, fetch, self._nursery.start_soon))
                pending.append((stage, name, replicas))
            else:
                call = stage_call(i, stage, name if self.names is not None else None)
                calls.append(LocalStage(call.name, stage, call.wants_feeds))
        with trio.move_on_after(self.start_timeout) as scope:
            async with open_nursery() as nursery:
                for stage, _, replicas in pending:
                    for replica in replicas:
                        nursery.start_soon(self._ready, stage, replica)
        if scope.cancelled_caught:
            waiting = [r.where() for _, _, rs in pending for r in rs if not r.node]
            raise ResourceError(
                f"replicas not placed and loaded within {self.start_timeout:g} s: {', '.join(waiting)} "
                "(does the cluster have a node with the CPUs, resources or placement they ask for?)"
            )
        return calls

    async def _ready(self, stage: Stage, replica: Replica) -> None:
        """Wait for ``replica`` to load; its load error (noted with where) if it failed."""
        try:
            report: ReplicaReport = await resolve(replica.actor.ready.remote())
        except ray.exceptions.RayActorError as e:
            raise FlowrtError(
                f"replica {replica.index} of stage {replica.stage!r} could not start: {e}"
            ) from e
        replica.node, replica.pid = report.node, report.pid
        if report.error is not None:
            report.error.add_note(f"loading the model of {replica.where()}")
            raise report.error
        logger.info("%s loaded its model in %.2f s", replica.where(), report.load_seconds)
