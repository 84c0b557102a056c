"""``flowrt serve``: a model repository served over HTTP with the KServe v2 protocol.

The HTTP server (hypercorn, its trio worker) runs in the runtime's own trio loop, with a
small ASGI application (``flowrt.serve.http.App``) in front of the :class:`Server`, which loads each
model of the repository into one ``flowrt.Runtime`` and sends every client's requests for a
model through that model's streams (``flowrt.serve.models``). Metrics in Prometheus's text
format at ``/metrics`` (``prometheus_client``); one log line per request at INFO.
"""

from __future__ import annotations

import functools
import logging
import time
from pathlib import Path
from typing import Any

import trio

from flowrt.errors import FlowrtError, InputError
from flowrt.serve import config as configs
from flowrt.serve import models as served
from flowrt.serve import protocol
from flowrt.serve.ensemble import ServedEnsemble
from flowrt.serve.http import MAX_BODY_BYTES, App
from flowrt.serve.models import NotFound

logger = logging.getLogger(__name__)

_BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128)


class _Live:
    """A Prometheus collector of what the models hold when the metrics are scraped: the
    batches each model's streams formed, by size; its memory pools, all and free; the
    requests waiting to start."""

    def __init__(self, models: Any) -> None:
        self.models = models  # () -> {name: served model}

    def collect(self) -> Any:
        from prometheus_client.core import GaugeMetricFamily, HistogramMetricFamily

        batches = HistogramMetricFamily(
            "flowrt_batch_size", "requests per batch the dynamic batcher ran", labels=["model"]
        )
        pools = GaugeMetricFamily(
            "flowrt_pools", "memory pools of the model and its batch sizes", labels=["model"]
        )
        free = GaugeMetricFamily("flowrt_pools_free", "of those, the free ones", labels=["model"])
        waiting = GaugeMetricFamily("flowrt_requests_waiting", "requests not started yet", labels=["model"])
        for name, model in self.models().items():
            counts = model.batch_counts()
            buckets = [(str(b), sum(c for size, c in counts.items() if size <= b)) for b in _BATCH_BUCKETS]
            buckets.append(("+Inf", sum(counts.values())))
            batches.add_metric([name], buckets, sum_value=sum(size * c for size, c in counts.items()))
            available, held = model.pools()
            pools.add_metric([name], held)
            free.add_metric([name], available)
            waiting.add_metric([name], model.waiting)
        yield from (batches, pools, free, waiting)


class Metrics:
    """The server's Prometheus metrics, in a registry of its own; ``models``: () -> the served
    models, whose state is read at each scrape."""

    def __init__(self, models: Any = dict) -> None:
        import prometheus_client as prom

        self.registry = prom.CollectorRegistry()
        self.requests = prom.Counter(
            "flowrt_requests", "inference requests", ["model", "outcome"], registry=self.registry
        )
        seconds = (1e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)
        self.queue = prom.Histogram(
            "flowrt_queue_seconds", "time a request waited to start", ["model"], buckets=seconds,
            registry=self.registry,
        )  # fmt: skip
        self.compute = prom.Histogram(
            "flowrt_compute_seconds", "time from a request's start to its outputs", ["model"], buckets=seconds,
            registry=self.registry,
        )  # fmt: skip
        self.rows = prom.Histogram(
            "flowrt_request_batch_size", "rows (batch) of each request", ["model"],
            buckets=_BATCH_BUCKETS, registry=self.registry,
        )  # fmt: skip
        self.registry.register(_Live(models))

    def text(self) -> bytes:
        import prometheus_client as prom

        return prom.generate_latest(self.registry)


class Server:
    """The models of ``repository`` loaded in ``runtime``; their tasks run in ``nursery``."""

    def __init__(
        self, repository: Path, runtime: Any, nursery: trio.Nursery, backends: str | None = None
    ) -> None:
        self.repository, self.runtime, self.nursery, self.backends = repository, runtime, nursery, backends
        self.models: dict[str, Any] = {}  # name -> ServedModel or ServedEnsemble
        self.failed: dict[str, str] = {}  # model name -> why it did not load
        self._gone: dict[int, trio.Event] = {}  # id(model) -> set once it has unloaded
        self.metrics = Metrics(lambda: dict(self.models))
        self.ready = False
        self.grpc_address: str | None = None  # host:port, when it serves gRPC too

    def names(self) -> list[str]:
        return [p.name for p in served.model_directories(self.repository)]

    async def load_all(self) -> None:
        """Every model of the repository, the ensembles last (they need their steps' models)."""
        ensembles = [n for n in self.names() if _is_ensemble(self.repository / n)]
        for name in [n for n in self.names() if n not in ensembles] + ensembles:
            try:
                await self.load(name)
            except FlowrtError as e:
                logger.error("model %r did not load: %s", name, e)
        self.ready = True

    async def load(self, name: str) -> Any:
        """Load model ``name`` of the repository (again, when it is loaded: the new one
        serves once it is ready, the old one finishes its requests)."""
        directory = self.repository / name
        if name not in self.names():
            raise NotFound(f"no model {name!r} in the repository {self.repository}")
        try:
            config = configs.read(directory)
            if config.platform == "ensemble":
                return self._ensemble(name, config)
            version, path = served.model_file(directory, config)
            opt = await trio.to_thread.run_sync(served.open_model, path, config.backends or self.backends)
            old = self.models.get(name)
            model = await self.nursery.start(self._hold, name, version, config, opt)
        except FlowrtError as e:
            self.failed[name] = f"{type(e).__name__}: {e}"
            raise
        self.failed.pop(name, None)
        if old is not None:
            await self._close(old)
        self.models[name] = model
        logger.info("model %r version %d loaded from %s", name, version, path)
        return model

    def _ensemble(self, name: str, config: configs.ModelConfig) -> Any:
        versions = served.versions(self.repository / name)
        model = ServedEnsemble(
            name, versions[-1] if versions else 1, config, lambda member: self.model(member, None)
        )
        self.failed.pop(name, None)
        self.models[name] = model  # nothing of its own to unload: replaced at once
        logger.info("ensemble %r loaded: %s", name, " -> ".join(s.model for s in config.steps))
        return model

    async def _hold(
        self,
        name: str,
        version: int,
        config: configs.ModelConfig,
        opt: Any,
        task_status=trio.TASK_STATUS_IGNORED,
    ) -> None:
        loaded = await self.runtime.load(opt, max_in_flight=config.instances)
        gone = trio.Event()
        try:
            async with trio.open_nursery() as nursery:
                model = served.ServedModel(name, version, config, loaded, nursery)
                self._gone[id(model)] = gone
                task_status.started(model)
                await model.closed.wait()
        finally:
            with trio.CancelScope(shield=True):
                await self.runtime.unload(loaded)
            gone.set()

    async def _close(self, model: Any) -> None:
        model.close()
        gone = self._gone.pop(id(model), None)  # None: an ensemble, which holds no runtime model
        if gone is not None:
            await gone.wait()

    async def unload(self, name: str) -> None:
        model = self.models.pop(name, None)
        if model is None:
            raise NotFound(f"model {name!r} is not loaded")
        await self._close(model)
        logger.info("model %r unloaded", name)

    async def close(self) -> None:
        for name in list(self.models):
            await self.unload(name)

    def model(self, name: str, version: str | None) -> Any:
        model = self.models.get(name)
        if model is None:
            known = sorted(self.models)
            raise NotFound(f"unknown model {name!r}; the server holds {known}")
        if version not in (None, "", str(model.version)):
            raise NotFound(f"model {name!r} has no version {version!r}; it serves version {model.version}")
        return model

    def index(self) -> list[dict[str, str]]:
        entries = []
        for name in self.names():
            if name in self.models:
                entries.append({"name": name, "version": str(self.models[name].version), "state": "READY"})
            elif name in self.failed:
                entries.append({"name": name, "state": "UNAVAILABLE", "reason": self.failed[name]})
            else:
                entries.append({"name": name, "state": "UNAVAILABLE", "reason": "unloaded"})
        return entries

    def metadata(self, model: Any) -> dict[str, Any]:
        batching = model.rows is not None

        def tensors(infos: Any) -> list[dict[str, Any]]:
            return [
                {"name": n, "datatype": protocol.datatype(i), "shape": protocol.shape(i, batching)}
                for n, i in infos.items()
                if i is not None
            ]

        return {
            "name": model.name,
            "versions": [str(model.version)],
            "platform": "flowrt",
            "inputs": tensors(model.inputs),
            "outputs": tensors(model.outputs),
        }

    async def infer(
        self, model: served.ServedModel, body: bytes, header_length: str | None
    ) -> tuple[bytes, dict[str, str]]:
        """An HTTP request's body to the response's body and headers."""
        request, feeds = protocol.parse_infer(body, header_length, model.inputs)
        chosen = protocol.requested_outputs(request, model.outputs)
        parameters = request.get("parameters") or {}
        if not isinstance(parameters, dict):
            raise protocol.BadRequest("'parameters' must be an object")
        values = await self.run(model, feeds, parameters)
        return protocol.infer_response(model.name, model.version, request, values, chosen)

    async def run(
        self, model: served.ServedModel, feeds: dict[str, Any], parameters: dict[str, Any]
    ) -> dict[str, Any]:
        """Run checked ``feeds`` through ``model``'s queue at the priority and with the timeout
        the request's ``parameters`` ask for (or its config's); the outputs."""
        config = model.config
        level = parameters.get("priority", config.default_priority_level)
        if (
            not isinstance(level, int)
            or level < 0
            or (config.priority_levels and level > config.priority_levels)
        ):
            raise protocol.BadRequest(
                f"priority {level!r} is not a level of this model (1..{config.priority_levels})"
            )
        timeout = config.queue.timeout
        if "timeout" in parameters:
            if not config.queue.allow_timeout_override:
                raise protocol.BadRequest(f"model {model.name!r} does not let a request set its timeout")
            value = parameters["timeout"]
            if not isinstance(value, int) or value < 0:
                raise protocol.BadRequest(f"'timeout' is in microseconds, an integer >= 0, got {value!r}")
            timeout = value / 1e6 if value else None
        rows = next(iter(feeds.values())).shape[0] if feeds and next(iter(feeds.values())).ndim else 1
        start = time.perf_counter()
        values, queued = await model.infer(feeds, served.priority_of(level, config.priority_levels), timeout)
        self.metrics.queue.labels(model.name).observe(queued)
        self.metrics.compute.labels(model.name).observe(time.perf_counter() - start - queued)
        self.metrics.rows.labels(model.name).observe(rows)
        return values


def _is_ensemble(directory: Path) -> bool:
    try:
        return configs.read(directory).platform == "ensemble"
    except InputError:
        return False  # its load says why


async def serve(
    repository: Path,
    *,
    host: str = "127.0.0.1",
    http_port: int = 8000,
    grpc_port: int | None = None,
    backends: str | None = None,
    max_body_bytes: int = MAX_BODY_BYTES,
    shutdown: trio.Event | None = None,
    task_status: Any = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve ``repository`` until ``shutdown`` is set (then in-flight requests finish, the
    models unload, and this returns). Started with ``nursery.start``, it hands back the
    server and the address it listens on for HTTP (``http://host:port``: port 0 takes a free
    one). ``grpc_port`` (None: no gRPC) serves KServe v2's gRPC service too, on that port
    (0: a free one), which ``server.grpc_address`` then holds (``host:port``)."""
    import hypercorn.config
    import hypercorn.trio

    import flowrt

    if not repository.is_dir():
        raise InputError(f"the model repository {repository} is not a directory")
    shutdown = trio.Event() if shutdown is None else shutdown
    config = hypercorn.config.Config()
    config.bind = [f"{host}:{http_port}"]
    config.accesslog = None
    config.graceful_timeout = GRACE_S
    grpc_server = None
    async with flowrt.Runtime() as rt, trio.open_nursery() as nursery:
        server = Server(repository, rt, nursery, backends)
        try:
            await server.load_all()
            if grpc_port is not None:
                from flowrt.serve import grpc_service

                token = trio.lowlevel.current_trio_token()
                grpc_server, bound = await trio.to_thread.run_sync(
                    grpc_service.start, server, token, host, grpc_port, max_body_bytes
                )
                server.grpc_address = f"{host}:{bound}"
            async with trio.open_nursery() as http:
                app: Any = App(server, max_body_bytes)  # an ASGI 3 application
                serving = functools.partial(hypercorn.trio.serve, app, config)
                binds = await http.start(functools.partial(serving, shutdown_trigger=shutdown.wait))
                if grpc_server is not None:
                    http.start_soon(_drain_grpc, grpc_server, shutdown)
                task_status.started((server, binds[0] if binds else f"http://{host}:{http_port}"))
            # both have returned: they stopped taking requests and those in flight finished
        finally:
            with trio.CancelScope(shield=True):
                if grpc_server is not None:
                    await trio.to_thread.run_sync(grpc_server.stop(0).wait)
                await server.close()


# Seconds the requests in flight have to finish once shutdown is asked for.
GRACE_S = 30


async def _drain_grpc(grpc_server: Any, shutdown: trio.Event) -> None:
    """Once ``shutdown`` is set: no new RPC is taken, those in flight finish (their handlers
    call into this loop, which goes on meanwhile)."""
    await shutdown.wait()
    await trio.to_thread.run_sync(grpc_server.stop(GRACE_S).wait)
