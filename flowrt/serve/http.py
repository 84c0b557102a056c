"""The HTTP side of ``flowrt serve``: a small ASGI application that routes KServe v2's
requests (``flowrt.serve.protocol``) to the :class:`~flowrt.serve.server.Server`, answers
its errors with their HTTP status and a JSON ``{"error": ...}``, and logs each request."""

from __future__ import annotations

import json
import logging
import time
from typing import TYPE_CHECKING, Any

import trio

from flowrt.errors import DataTypeError, FlowrtError, InputError, ResourceError, ShapeError
from flowrt.serve import models as served
from flowrt.serve import protocol
from flowrt.serve.models import NotFound

if TYPE_CHECKING:
    from flowrt.serve.server import Server

logger = logging.getLogger(__name__)

MAX_BODY_BYTES = 64 << 20
# Before answering 413, the rest of the body is read and dropped, up to this many bytes and
# seconds (as nginx's lingering close does): answered at once, the connection closes while
# the client still sends, and it gets a reset (EPIPE), not the answer.
DISCARD_BYTES = 1 << 30
DISCARD_S = 10.0


async def _discard_body(receive: Any) -> None:
    """Read the rest of a refused body and drop it, within ``DISCARD_BYTES`` and
    ``DISCARD_S``: the client then reads the answer once it has sent all it had."""
    left = DISCARD_BYTES
    with trio.move_on_after(DISCARD_S):
        while left > 0:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            left -= len(message.get("body", b""))
            if not message.get("more_body", False):
                return


def _status(error: Exception) -> int:
    if isinstance(error, NotFound):
        return 404
    if isinstance(error, _TooLarge):
        return 413
    if isinstance(error, served.QueueFull | served.QueueTimeout):
        return 503
    if isinstance(error, protocol.BadRequest | ShapeError | DataTypeError | InputError):
        return 400
    if isinstance(error, ResourceError):
        return 503
    return 500


class App:
    """The ASGI application: KServe v2's routes over :class:`Server`."""

    def __init__(self, server: Server, max_body_bytes: int = MAX_BODY_BYTES) -> None:
        self.server, self.max_body_bytes = server, max_body_bytes

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while (await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            await send({"type": "lifespan.shutdown.complete"})
            return
        if scope["type"] != "http":
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        method, path = scope["method"], scope["path"]
        start = time.perf_counter()
        try:
            body = await self._body(receive, headers)
            status, payload, extra = await self._route(method, path.rstrip("/").split("/")[1:], body, headers)
        except FlowrtError as e:
            status, payload, extra = _status(e), json.dumps({"error": str(e)}).encode(), {}
        except Exception as e:  # a bug of ours: answered, logged, the server goes on
            logger.exception("%s %s failed", method, path)
            status, payload, extra = 500, json.dumps({"error": f"{type(e).__name__}: {e}"}).encode(), {}
        response_headers = {"content-type": "application/json", **extra, "content-length": str(len(payload))}
        await send(
            {
                "type": "http.response.start",
                "status": status,
                "headers": [(k.encode(), v.encode()) for k, v in response_headers.items()],
            }
        )
        await send({"type": "http.response.body", "body": payload})
        logger.info("%s %s %d %.1f ms", method, path, status, (time.perf_counter() - start) * 1e3)

    async def _body(self, receive: Any, headers: dict[str, str]) -> bytes:
        announced = headers.get("content-length")
        if announced is not None and announced.isdigit() and int(announced) > self.max_body_bytes:
            await _discard_body(receive)
            raise _TooLarge(
                f"the body's {announced} bytes are over the server's limit, {self.max_body_bytes}"
            )
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                break
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_body_bytes:
                if message.get("more_body", False):
                    await _discard_body(receive)
                raise _TooLarge(f"the body is over the server's limit, {self.max_body_bytes} bytes")
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        return b"".join(chunks)

    async def _route(
        self, method: str, parts: list[str], body: bytes, headers: dict[str, str]
    ) -> tuple[int, bytes, dict[str, str]]:
        server = self.server
        if parts == ["metrics"] and method == "GET":
            return 200, server.metrics.text(), {"content-type": "text/plain; version=0.0.4"}
        if not parts or parts[0] != "v2":
            raise NotFound(f"no route {'/' + '/'.join(parts)}; the server speaks KServe v2 under /v2")
        rest = parts[1:]
        if rest == [] and method == "GET":
            return _ok(
                {
                    "name": "flowrt",
                    "version": protocol.server_version(),
                    "extensions": list(protocol.EXTENSIONS),
                }
            )
        if rest == ["health", "live"]:
            return 200, b"", {}
        if rest == ["health", "ready"]:
            return (200 if server.ready else 503), b"", {}
        if rest[:1] == ["repository"]:
            return await self._repository(method, rest[1:])
        if rest[:1] == ["models"] and len(rest) >= 2:
            name, tail, version = rest[1], rest[2:], None
            if tail[:1] == ["versions"] and len(tail) >= 2:
                version, tail = tail[1], tail[2:]
            if tail == ["ready"]:
                try:
                    server.model(name, version)
                except NotFound:
                    return 400, b"", {}
                return 200, b"", {}
            model = server.model(name, version)
            if tail == [] and method == "GET":
                return _ok(server.metadata(model))
            if tail == ["config"] and method == "GET":
                return _ok(_config_json(model))
            if tail == ["infer"] and method == "POST":
                try:
                    payload, extra = await server.infer(model, body, headers.get(protocol.HEADER_LENGTH))
                except FlowrtError as e:
                    server.metrics.requests.labels(model.name, "failure").inc()
                    raise e
                server.metrics.requests.labels(model.name, "success").inc()
                return 200, payload, extra
        raise NotFound(f"no route {method} /{'/'.join(parts)}")

    async def _repository(self, method: str, rest: list[str]) -> tuple[int, bytes, dict[str, str]]:
        server = self.server
        if rest == ["index"] and method == "POST":
            return _ok(server.index())
        if len(rest) == 3 and rest[0] == "models" and method == "POST":
            if rest[2] == "load":
                await server.load(rest[1])
                return 200, b"", {}
            if rest[2] == "unload":
                await server.unload(rest[1])
                return 200, b"", {}
        raise NotFound(f"no repository route {method} {'/'.join(rest)}")


class _TooLarge(FlowrtError):
    pass


def _ok(value: Any) -> tuple[int, bytes, dict[str, str]]:
    return 200, json.dumps(value).encode(), {}


def _config_json(model: Any) -> dict[str, Any]:
    config = model.config
    return {
        "name": model.name,
        "platform": config.platform or "flowrt",
        "max_batch_size": config.max_batch_size,
        "dynamic_batching": (
            {
                "preferred_batch_size": list(config.preferred_batch_size),
                "max_queue_delay_microseconds": round(config.max_queue_delay * 1e6),
            }
            if config.dynamic_batching
            else None
        ),
        "instance_group": [{"count": model.model.pools.count, "kind": "KIND_CPU"}]
        if hasattr(model, "model")
        else [],
    }
