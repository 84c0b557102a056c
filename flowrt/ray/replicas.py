"""The driver's side of one Ray stage: its replicas, which one takes a request, and what
happens when one dies.

A request goes to the live replica with the fewest requests in flight. The stage holds at
most ``concurrency`` requests at once (``Stage.max_in_flight`` per replica): more wait here,
on the driver, not in the actors' queues, so that backpressure reaches the producer. The
outputs of a model stage stay in Ray's object store (``RemoteOutputs``): the next stage's
replica reads them from there, on whichever node it runs, and only a function stage or the
pipeline's result brings them to the driver.

A replica whose actor dies (its process killed, its node lost) fails the requests it was
running; each is sent once more, to another live replica, and fails with a RunError naming
the stage and the nodes if that one dies too. The dead replica is left out until Ray has
restarted it (``Stage.max_restarts``) and it answers again; a stage with no live replica
fails each request at once.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import attrs
import ray
import trio

from flowrt.errors import FlowrtError, RunError
from flowrt.ray.refs import resolve
from flowrt.ray.replica import ReplicaReport
from flowrt.types import Priority

logger = logging.getLogger(__name__)

# How often a replica that is being restarted is asked whether it is back.
PROBE_INTERVAL = 0.2


@attrs.define(eq=False)
class RemoteOutputs:
    """A model stage's outputs, left in Ray's object store."""

    ref: ray.ObjectRef

    async def fetch(self) -> dict[str, Any]:
        """The outputs, here (read-only arrays where Ray maps them from its store)."""
        return await resolve(self.ref)


@attrs.define(eq=False)
class Replica:
    """One actor of a stage, as the driver tracks it. ``state``: "live", "restarting" (it
    died; Ray restarts it) or "dead" (it will not come back)."""

    stage: str
    index: int
    actor: Any
    node: str = ""
    pid: int = 0
    state: str = "live"
    in_flight: int = 0
    served: int = 0
    restarts: int = 0

    def where(self) -> str:
        return f"replica {self.index} of stage {self.stage!r} on node {self.node}"


@attrs.frozen
class ReplicaInfo:
    """A snapshot of one replica (``flowrt.ray.Pipeline.replicas``): its actor handle, the node
    it runs on, its state, its requests in flight, those it served and its restarts."""

    stage: str
    index: int
    actor: Any
    node: str
    pid: int
    state: str
    in_flight: int
    served: int
    restarts: int


class _ReplicaLost(Exception):
    """A replica's actor died while it ran a request."""

    def __init__(self, replica: Replica, error: BaseException) -> None:
        super().__init__(f"{replica.where()} died while running this request ({type(error).__name__})")
        self.replica = replica


class RayStageCall:
    """A Ray stage as the pipeline calls it: ``await call(values, feeds, priority)``.

    ``fetch`` makes it return the outputs themselves (the last stage, or one before a function
    stage) rather than ``RemoteOutputs``. ``spawn`` starts a task in the pipeline's nursery
    (the watch over a replica being restarted).
    """

    def __init__(self, name: str, replicas: list[Replica], per_replica: int, fetch: bool, spawn: Any) -> None:
        self.name = name
        self.replicas = replicas
        self.concurrency = per_replica * len(replicas)
        self.fetch = fetch
        self.retries = 0
        self._spawn = spawn
        self._slots = trio.Semaphore(self.concurrency)
        self._turn = 0  # round robin among the least loaded

    def _pick(self, exclude: Replica | None = None) -> Replica | None:
        live = [r for r in self.replicas if r.state == "live" and r is not exclude]
        if not live:
            return None
        self._turn += 1
        fewest = min(r.in_flight for r in live)
        least = [r for r in live if r.in_flight == fewest]
        return least[self._turn % len(least)]

    def _no_live_replica(self) -> FlowrtError:
        states = ", ".join(f"replica {r.index} on node {r.node} {r.state}" for r in self.replicas)
        return FlowrtError(f"stage {self.name!r} has no live replica ({states})")

    async def __call__(self, values: Any, feeds: Mapping[str, Any], priority: Priority) -> Any:
        argument = values.ref if isinstance(values, RemoteOutputs) else values
        async with self._slots:
            replica = self._pick()
            if replica is None:
                raise self._no_live_replica()
            try:
                outputs = await self._on(replica, argument, priority)
            except _ReplicaLost as lost:
                other = self._pick(exclude=replica)
                if other is None:
                    raise FlowrtError(f"{lost}, and no other replica is live to retry it on") from None
                self.retries += 1
                logger.info("%s; retrying the request on %s", lost, other.where())
                try:
                    outputs = await self._on(other, argument, priority)
                except _ReplicaLost as again:
                    raise FlowrtError(f"{lost}; retried on {other.where()}, which died too") from again
        return outputs

    async def _on(self, replica: Replica, argument: Any, priority: Priority) -> Any:
        """One run on ``replica``: its outputs, or (``fetch`` False) their place in the object
        store. A stage that fetches asks for the outcome and the outputs as one object, so that
        one wait brings both; another waits for the outcome alone."""
        replica.in_flight += 1
        incarnation = replica.restarts  # the one this request goes to
        try:
            if self.fetch:
                result = replica.actor.run.options(num_returns=1).remote(argument, int(priority))
                outcome, outputs = await resolve(result)
            else:
                outcome, outputs_ref = replica.actor.run.remote(argument, int(priority))
                outcome = await resolve(outcome)
                outputs = RemoteOutputs(outputs_ref)
        except ray.exceptions.RayActorError as e:
            self._lost(replica, incarnation)
            raise _ReplicaLost(replica, e) from e
        except ray.exceptions.RayError as e:  # e.g. the previous stage's outputs were lost
            raise FlowrtError(f"{replica.where()} could not run this request: {e}") from e
        finally:
            replica.in_flight -= 1
        if outcome.cause is not None:
            raise RunError(outcome.layer, outcome.backend, outcome.cause)
        replica.served += 1
        return outputs

    def _lost(self, replica: Replica, incarnation: int) -> None:
        """A request to ``replica`` as it was after ``incarnation`` restarts found it dead: watch
        it come back, unless that death is one already seen (a request sent before a restart
        can fail after it, once the restarted replica is live again)."""
        if replica.state == "live" and replica.restarts == incarnation:
            replica.state = "restarting"
            logger.warning("%s died; waiting for Ray to restart it", replica.where())
            self._spawn(self._watch, replica)

    async def _watch(self, replica: Replica) -> None:
        """Until the replica answers again (live) or Ray gives it up (dead)."""
        while True:
            try:
                report: ReplicaReport = await resolve(replica.actor.ready.remote())
            except ray.exceptions.ActorDiedError:
                replica.state = "dead"
                logger.warning("%s is dead and will not be restarted", replica.where())
                return
            except ray.exceptions.RayActorError:  # still restarting
                await trio.sleep(PROBE_INTERVAL)
                continue
            if report.error is not None:
                replica.state = "dead"
                logger.warning("%s restarted but its model did not load: %s", replica.where(), report.error)
                return
            replica.node, replica.pid, replica.state = report.node, report.pid, "live"
            replica.restarts += 1
            logger.info("%s is back", replica.where())
            return

    def info(self) -> list[ReplicaInfo]:
        return [
            ReplicaInfo(r.stage, r.index, r.actor, r.node, r.pid, r.state, r.in_flight, r.served, r.restarts)
            for r in self.replicas
        ]
