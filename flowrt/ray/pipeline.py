"""``flowrt.ray.Pipeline``: a pipeline whose model stages run on Ray actors, with the interface
of a local ``flowrt.Pipeline``.

::

    async with flowrt.ray.Pipeline([Stage(detector, replicas=2), crops, Stage(classifier)]) as p:
        outputs = await p.run({"image": frame})
        async with p.stream() as s:              # send / send_nowait / submit / close / async for
            ...

The same code runs under trio and under asyncio. Under asyncio the pipeline's trio side (its
replicas' bookkeeping and its streams) runs in a trio loop of its own thread, as a runtime
entered under asyncio does (``flowrt.aio``), and its streams are ``AioStream``s.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from flowrt.aio import AioStream, AsyncioBridge, async_library
from flowrt.errors import ArgumentError, FlowrtError, StreamClosedError
from flowrt.pipeline import Pipeline as LocalPipeline
from flowrt.pipeline import PipelineStream
from flowrt.ray.deployment import Deployment, LocalStage
from flowrt.ray.replicas import RayStageCall, ReplicaInfo
from flowrt.ray.stage import Stage
from flowrt.types import Priority
from flowrt.validate import check_instance, check_priority, check_seconds


class Pipeline:
    """Stages on a Ray cluster, overlapped over a stream of requests, results in submission order.

    ``stages`` are ``flowrt.ray.Stage``s (a model and its replicas) and functions, sync or
    async, ``fn(outputs)`` or ``fn(outputs, feeds)``, which run on the driver as in a local
    ``flowrt.Pipeline``. A model stage's outputs stay in Ray's object store until the next
    model stage's replica reads them, on its own node; a function stage, and the pipeline's
    result, get them here (arrays that Ray maps from its store are read-only: copy one to
    write to it).

    Use as ``async with flowrt.ray.Pipeline(...) as pipeline`` after ``ray.init``: entering it
    starts every replica and waits until each has loaded its model (``start_timeout``
    seconds at most: ResourceError when the cluster cannot place them); leaving it kills
    them. Then ``run``, and ``stream`` with ``send``, ``send_nowait``, ``submit``, ``close``
    and ``async for``, behave as a local pipeline's: a stage holds at most its bound of
    requests (``Stage.max_in_flight`` per replica), the stream ``max_in_flight`` in all, and
    a failure reaches its request's receiver as a ``RunError`` naming the stage. Model stages
    run at ``priority`` on their replicas.

    A replica that dies has its requests sent once more to another replica of its stage (see
    ``flowrt.ray.replicas``); ``replicas()`` and ``placement`` say where each runs.
    """

    def __init__(
        self,
        stages: Sequence[Stage | Any],
        *,
        names: Sequence[str] | None = None,
        priority: Priority = Priority.MEDIUM,
        start_timeout: float = 120.0,
    ) -> None:
        if isinstance(stages, Stage) or callable(stages):
            raise ArgumentError(
                "flowrt.ray.Pipeline: stages must be a list of Stages and functions, got one "
                "(a pipeline of one stage is Pipeline([stage]))"
            )
        check_instance(
            "stages", stages, Sequence, "a list of Stages and functions", where="flowrt.ray.Pipeline"
        )
        stages = list(stages)
        if not stages:
            raise ArgumentError("flowrt.ray.Pipeline: stages must hold at least one stage, got none")
        for i, stage in enumerate(stages):
            if not isinstance(stage, Stage) and not callable(stage):
                raise ArgumentError(
                    f"flowrt.ray.Pipeline: stage {i} must be a flowrt.ray.Stage or a function, "
                    f"got {type(stage).__name__}"
                )
        if names is not None:
            if len(names) != len(stages):
                raise ArgumentError(f"flowrt.ray.Pipeline: {len(names)} names given for {len(stages)} stages")
            for i, name in enumerate(names):
                check_instance(f"names[{i}]", name, str, "a str", where="flowrt.ray.Pipeline")
        self._deployment = Deployment(
            stages,
            names,
            check_priority(priority, where="flowrt.ray.Pipeline"),
            check_seconds("start_timeout", start_timeout, where="flowrt.ray.Pipeline"),
        )
        self._bridge: AsyncioBridge | None = None
        self._state = "new"  # "open", "closed"

    async def __aenter__(self) -> Pipeline:
        if self._state != "new":
            raise StreamClosedError(
                "flowrt.ray.Pipeline was entered before: make a new one for each 'async with'"
            )
        self._state = "open"
        try:
            await self._enter()
        except BaseException:
            self._state = "closed"
            raise
        return self

    async def _enter(self) -> None:
        if async_library() == "asyncio":
            # The deployment runs in a trio thread of its own; entered (replicas started) there.
            bridge = await AsyncioBridge.start(self._deployment, what="flowrt.ray.Pipeline")
            self._bridge = bridge
            deployment = self._deployment
            # Its calls cross from this loop into the trio thread by the bridge.
            deployment.pipeline = LocalPipeline.of_calls(deployment.calls, deployment.priority, bridge)
            for call in self._deployment.calls:
                if isinstance(call, LocalStage):
                    call.bridge = bridge
        else:
            await self._deployment.__aenter__()

    async def __aexit__(self, *exc_info: Any) -> bool | None:
        self._state = "closed"
        if self._bridge is not None:
            await self._bridge.close()
            return None
        return await self._deployment.__aexit__(*exc_info)

    def _open(self) -> Any:
        if self._state != "open" or self._deployment.pipeline is None:
            raise FlowrtError(
                f"flowrt.ray.Pipeline is {'closed' if self._state == 'closed' else 'not open yet'}: "
                "use it within its 'async with'"
            )
        return self._deployment.pipeline

    async def run(self, feeds: Mapping[str, Any]) -> Any:
        """One request through every stage in turn; its last stage's result."""
        return await self._open().run(feeds)

    def stream(self, *, max_in_flight: int | None = None) -> PipelineStream | AioStream:
        """A bounded stream of requests through the stages, results in submission order
        (default ``max_in_flight``: twice the requests the stages hold at once)."""
        return self._open().stream(max_in_flight=max_in_flight)

    def _ray_calls(self) -> list[RayStageCall]:
        return [c for c in self._deployment.calls if isinstance(c, RayStageCall)]

    def replicas(self, stage: str | None = None) -> list[ReplicaInfo]:
        """Snapshots of the replicas of ``stage`` (by name; default every model stage's)."""
        calls = self._ray_calls()
        if stage is not None:
            calls = [c for c in calls if c.name == stage]
            if not calls:
                known = ", ".join(repr(c.name) for c in self._ray_calls())
                raise ArgumentError(f"flowrt.ray.Pipeline: no model stage named {stage!r}; there are {known}")
        return [info for c in calls for info in c.info()]

    @property
    def placement(self) -> dict[str, list[str]]:
        """Each model stage's name and the Ray node ids its replicas run on, in replica order."""
        return {c.name: [r.node for r in c.replicas] for c in self._ray_calls()}

    @property
    def retries(self) -> dict[str, int]:
        """Each model stage's name and the requests it sent again after a replica died."""
        return {c.name: c.retries for c in self._ray_calls()}
