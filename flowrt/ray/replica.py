"""The Ray actor that serves one replica of a stage: a loaded model in a process of the cluster.

Like ``flowrt.InferenceSession``, the actor owns a flowrt ``Runtime`` in a trio loop of its own
thread (``flowrt.trio_thread.TrioThread``); the actor's methods run in Ray's asyncio loop and
await runs started in that thread, so that many requests are in flight on one replica while
its memory pools bound how many execute.

Nothing the actor hands back is an exception raised at the driver by Ray: a run's outcome is a
small ``RunOutcome`` (its error, if any, made picklable) returned beside the outputs
(``num_returns=2``), so that the driver can wait for the outcome alone while the outputs stay
in the object store until the next stage reads them. A load that fails is kept and reported by
``ready()``: the constructor never raises, so a restarted replica reports the same way.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import pickle
import time
from collections.abc import Mapping, Sequence
from typing import Any

import attrs
import ray

from flowrt.engine.graph.optimizer import OptimizedNetwork, optimize
from flowrt.errors import FlowrtError, RunError
from flowrt.types import Priority

logger = logging.getLogger(__name__)


def portable(error: BaseException) -> BaseException:
    """``error`` if it survives pickling, else a FlowrtError that carries its type and message."""
    try:
        pickle.loads(pickle.dumps(error))
    except Exception:
        return FlowrtError(f"{type(error).__name__}: {error}")
    return error


@attrs.frozen
class ReplicaReport:
    """What a replica says once its model is loaded (or failed to load)."""

    node: str
    pid: int
    load_seconds: float
    error: BaseException | None = None


@attrs.frozen
class RunOutcome:
    """How one run on a replica ended: ``seconds`` the run took there; on failure, the
    ``RunError``'s ``layer``, ``backend`` and ``cause`` (the outputs are then None)."""

    node: str
    seconds: float
    layer: str | None = None
    backend: str | None = None
    cause: BaseException | None = None


class ModelReplica:
    """One loaded model, served to the driver's pipeline (see the module doc)."""

    def __init__(
        self, network: list[Any], backends: Sequence[str] | None, cpu_workers: int, pools: int
    ) -> None:
        """``network``: ``[ref]``, the reference of the model's ``ModelPayload`` in Ray's
        object store."""
        from flowrt.runtime import Runtime
        from flowrt.trio_thread import TrioThread

        self._node = ray.get_runtime_context().get_node_id()
        self._error: BaseException | None = None
        self._thread: Any = None
        start = time.perf_counter()
        try:
            model = ray.get(network[0]).network()
            optimized = (
                model
                if isinstance(model, OptimizedNetwork)
                else optimize(model, backends=None if backends is None else list(backends))
            )
            runtime = Runtime(cpu_workers=cpu_workers)
            self._thread = TrioThread(name="flowrt-ray-replica", resource=runtime, what="Ray replica")
            self._model = self._thread.run(functools.partial(runtime.load, optimized, max_in_flight=pools))
        except Exception as e:
            logger.exception("replica on node %s failed to load its model", self._node)
            self._error = portable(e)
        self._load_seconds = time.perf_counter() - start

    def ready(self) -> ReplicaReport:
        """Where the replica runs, and whether its model loaded."""
        return ReplicaReport(self._node, os.getpid(), self._load_seconds, self._error)

    @ray.method(num_returns=2)
    async def run(self, feeds: Mapping[str, Any], priority: int) -> tuple[RunOutcome, Any]:
        """One run: ``(RunOutcome, outputs)``; outputs None when the run failed."""
        start = time.perf_counter()
        if self._error is not None:
            cause = FlowrtError(f"the replica's model did not load: {self._error}")
            return RunOutcome(self._node, 0.0, cause=cause), None
        call = self._thread.call_soon(functools.partial(self._model.run, feeds, priority=Priority(priority)))
        try:
            outputs = await asyncio.shield(asyncio.wrap_future(call.future))
        except asyncio.CancelledError:  # the driver gave the request up: stop the run too
            call.cancel()
            raise
        except RunError as e:
            outcome = RunOutcome(
                self._node, time.perf_counter() - start, e.layer, e.backend, portable(e.cause)
            )
            return outcome, None
        except Exception as e:
            return RunOutcome(self._node, time.perf_counter() - start, cause=portable(e)), None
        return RunOutcome(self._node, time.perf_counter() - start), outputs


# The actor class as Ray sees it: its methods run in Ray's asyncio loop (``run`` is async).
ModelReplicaActor = ray.remote(ModelReplica)
