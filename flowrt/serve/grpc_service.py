"""The gRPC side of ``flowrt serve``: KServe v2's ``GRPCInferenceService`` as Triton speaks it,
the messages those of Triton's own client (``tritonclient.grpc``).

grpcio's server runs its handlers in a pool of threads; each handler hands its request to
the :class:`~flowrt.serve.server.Server` in the runtime's trio loop
(``trio.from_thread.run``), so requests over gRPC and over HTTP go through the same
per-model queues and share batches. A stream's requests each become a task of that loop
as they are read, and are answered as they finish. Tensors come as ``raw_input_contents`` (what the client
sends) or as typed ``contents``; outputs go back as ``raw_output_contents``. Errors answer
with gRPC's status codes: NOT_FOUND (unknown model), INVALID_ARGUMENT (a request the model
does not take), UNAVAILABLE (a full queue, a request past its timeout, a server shutting
down), INTERNAL (a bug of ours, logged).
"""

from __future__ import annotations

import functools
import logging
import queue
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

import grpc
import numpy as np
import trio
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc as pb_grpc

from flowrt.errors import DataTypeError, FlowrtError, InputError, ResourceError, ShapeError
from flowrt.serve import models as served
from flowrt.serve import protocol
from flowrt.serve.ensemble import MemberGone
from flowrt.serve.models import NotFound

if TYPE_CHECKING:
    from flowrt.serve.server import Server

logger = logging.getLogger(__name__)

# Threads answering RPCs: each request waiting in a model's queue holds one, so this bounds
# the requests in flight over gRPC (the models' own queues bound them further).
THREADS = 128
# Requests of one stream in flight at once; the stream's next is read when one is answered.
STREAM_IN_FLIGHT = 64

# datatype -> the field of InferTensorContents that holds it
_CONTENTS = {
    "BOOL": "bool_contents",
    "INT8": "int_contents",
    "INT16": "int_contents",
    "INT32": "int_contents",
    "INT64": "int64_contents",
    "UINT8": "uint_contents",
    "UINT16": "uint_contents",
    "UINT32": "uint_contents",
    "UINT64": "uint64_contents",
    "FP32": "fp32_contents",
    "FP64": "fp64_contents",
}


def _code(error: Exception) -> grpc.StatusCode:
    if isinstance(error, NotFound):
        return grpc.StatusCode.NOT_FOUND
    if isinstance(error, served.QueueFull | served.QueueTimeout | MemberGone | ResourceError):
        return grpc.StatusCode.UNAVAILABLE
    if isinstance(error, protocol.BadRequest | ShapeError | DataTypeError | InputError):
        return grpc.StatusCode.INVALID_ARGUMENT
    return grpc.StatusCode.INTERNAL


def parse_request(
    request: pb.ModelInferRequest, inputs: dict[str, Any]
) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """(feeds, parameters) of a ModelInferRequest, checked against the model's ``inputs``."""
    raw = list(request.raw_input_contents)
    if raw and len(raw) != len(request.inputs):
        raise protocol.BadRequest(
            f"{len(raw)} raw_input_contents for {len(request.inputs)} inputs: give one per input, or none"
        )
    feeds: dict[str, np.ndarray] = {}
    for index, entry in enumerate(request.inputs):
        dims = list(entry.shape)
        dtype, count = protocol.check_input(entry.name, entry.datatype, dims, inputs, feeds)
        if raw:
            if len(raw[index]) != count * dtype.itemsize:
                raise protocol.BadRequest(
                    f"input {entry.name!r}: {len(raw[index])} bytes of raw contents, expected "
                    f"{count * dtype.itemsize} for shape {dims} {entry.datatype}"
                )
            array = np.frombuffer(raw[index], dtype).reshape(dims).copy()
        else:
            field = _CONTENTS.get(entry.datatype)
            if field is None:
                raise protocol.BadRequest(
                    f"input {entry.name!r}: {entry.datatype} tensors come as raw_input_contents only"
                )
            values = np.asarray(getattr(entry.contents, field), dtype)
            if values.size != count:
                raise protocol.BadRequest(
                    f"input {entry.name!r}: {values.size} values in {field} for shape {dims}, which holds {count}"
                )
            array = values.reshape(dims)
        feeds[entry.name] = array
    protocol.missing_inputs(inputs, feeds)
    return feeds, _parameters(request.parameters)


def _parameters(parameters: Any) -> dict[str, Any]:
    out = {}
    for key, value in parameters.items():
        which = value.WhichOneof("parameter_choice")
        out[key] = getattr(value, which) if which is not None else None
    return out


def infer_response(
    model: Any, request: pb.ModelInferRequest, values: dict[str, np.ndarray]
) -> pb.ModelInferResponse:
    """The response: the outputs the request names (all when it names none), raw."""
    names = [o.name for o in request.outputs] or list(model.outputs)
    response = pb.ModelInferResponse(model_name=model.name, model_version=str(model.version), id=request.id)
    for name in names:
        if name not in model.outputs:
            raise protocol.BadRequest(
                f"unknown output {name!r}; the model's outputs are {sorted(model.outputs)}"
            )
        value = np.ascontiguousarray(values[name])
        tensor = response.outputs.add(name=name, datatype=protocol.datatype_of(value.dtype))
        tensor.shape.extend(value.shape)
        response.raw_output_contents.append(value.tobytes())
    return response


class Servicer(pb_grpc.GRPCInferenceServiceServicer):
    """Each RPC of ``GRPCInferenceService`` over :class:`Server`, called from grpcio's threads."""

    def __init__(self, server: Server, token: trio.lowlevel.TrioToken) -> None:
        self.server, self.token = server, token

    def _in_loop(self, fn: Callable[..., Any], *args: Any) -> Any:
        return trio.from_thread.run(fn, *args, trio_token=self.token)

    def _model(self, name: str, version: str) -> Any:
        return trio.from_thread.run_sync(self.server.model, name, version, trio_token=self.token)

    def ServerLive(self, request: Any, context: Any) -> Any:
        return pb.ServerLiveResponse(live=True)

    def ServerReady(self, request: Any, context: Any) -> Any:
        return pb.ServerReadyResponse(ready=self.server.ready)

    def ModelReady(self, request: Any, context: Any) -> Any:
        try:
            self._model(request.name, request.version)
        except NotFound:
            return pb.ModelReadyResponse(ready=False)
        return pb.ModelReadyResponse(ready=True)

    def ServerMetadata(self, request: Any, context: Any) -> Any:
        return pb.ServerMetadataResponse(
            name="flowrt", version=protocol.server_version(), extensions=list(protocol.EXTENSIONS)
        )

    def ModelMetadata(self, request: Any, context: Any) -> Any:
        model = self._model(request.name, request.version)
        meta = self.server.metadata(model)
        return pb.ModelMetadataResponse(
            name=meta["name"],
            versions=meta["versions"],
            platform=meta["platform"],
            inputs=[pb.ModelMetadataResponse.TensorMetadata(**t) for t in meta["inputs"]],
            outputs=[pb.ModelMetadataResponse.TensorMetadata(**t) for t in meta["outputs"]],
        )

    def ModelConfig(self, request: Any, context: Any) -> Any:
        from tritonclient.grpc import model_config_pb2 as mc

        model = self._model(request.name, request.version)
        config = model.config
        out = mc.ModelConfig(
            name=model.name, platform=config.platform or "flowrt", max_batch_size=config.max_batch_size
        )
        if config.dynamic_batching:
            out.dynamic_batching.preferred_batch_size.extend(config.preferred_batch_size)
            out.dynamic_batching.max_queue_delay_microseconds = round(config.max_queue_delay * 1e6)
        return pb.ModelConfigResponse(config=out)

    def ModelInfer(self, request: Any, context: Any) -> Any:
        return self._infer(request)

    def ModelStreamInfer(self, request_iterator: Iterator[Any], context: Any) -> Iterator[Any]:
        """Each request of the stream run as it arrives, beside the others (a stream's requests
        share batches), at most ``STREAM_IN_FLIGHT`` at once; each answered when it is done,
        with its result or its error (its ``id`` tells which), and the stream goes on."""
        answers: queue.Queue = queue.Queue()
        slots = threading.Semaphore(STREAM_IN_FLIGHT)

        async def answer(request: Any) -> None:
            start = time.perf_counter()
            try:
                response = pb.ModelStreamInferResponse(infer_response=await self._infer_async(request))
            except FlowrtError as e:
                response = pb.ModelStreamInferResponse(
                    error_message=str(e), infer_response=pb.ModelInferResponse(id=request.id)
                )
            except Exception as e:  # a bug of ours: answered, logged, the stream goes on
                logger.exception("grpc ModelStreamInfer failed")
                response = pb.ModelStreamInferResponse(
                    error_message=f"{type(e).__name__}: {e}",
                    infer_response=pb.ModelInferResponse(id=request.id),
                )
            _log("ModelStreamInfer", request.model_name, response.error_message and "ERROR" or "OK", start)
            slots.release()
            answers.put(response)

        def read() -> None:
            count = 0
            try:
                for request in request_iterator:
                    slots.acquire()
                    trio.from_thread.run_sync(
                        self.server.nursery.start_soon, answer, request, trio_token=self.token
                    )
                    count += 1
            except (trio.RunFinishedError, grpc.RpcError):  # shutting down, or the client left
                pass
            finally:
                answers.put(_Read(count))

        threading.Thread(target=read, name="flowrt-grpc-stream", daemon=True).start()
        expected, sent = None, 0
        while expected is None or sent < expected:
            item = answers.get()
            if isinstance(item, _Read):
                expected = item.count
                continue
            sent += 1
            yield item

    def _infer(self, request: Any) -> Any:
        return self._in_loop(self._infer_async, request)

    async def _infer_async(self, request: Any) -> Any:
        """A ModelInferRequest's response, in the loop; its outcome counted."""
        model = self.server.model(request.model_name, request.model_version)
        metrics = self.server.metrics.requests
        try:
            feeds, parameters = parse_request(request, model.inputs)
            values = await self.server.run(model, feeds, parameters)
            response = infer_response(model, request, values)
        except FlowrtError:
            metrics.labels(model.name, "failure").inc()
            raise
        metrics.labels(model.name, "success").inc()
        return response

    def RepositoryIndex(self, request: Any, context: Any) -> Any:
        entries = self.server.index()
        if request.ready:
            entries = [e for e in entries if e["state"] == "READY"]
        return pb.RepositoryIndexResponse(
            models=[pb.RepositoryIndexResponse.ModelIndex(**e) for e in entries]
        )

    def RepositoryModelLoad(self, request: Any, context: Any) -> Any:
        self._in_loop(self.server.load, request.model_name)
        return pb.RepositoryModelLoadResponse()

    def RepositoryModelUnload(self, request: Any, context: Any) -> Any:
        self._in_loop(self.server.unload, request.model_name)
        return pb.RepositoryModelUnloadResponse()


class _Read:
    """The end of a stream's requests: how many there were."""

    def __init__(self, count: int) -> None:
        self.count = count


def _log(method: str, what: str, status: str, start: float) -> None:
    logger.info("grpc %s %s %s %.1f ms", method, what, status, (time.perf_counter() - start) * 1e3)


def _answered(name: str, handler: Callable[..., Any]) -> Callable[..., Any]:
    """``handler`` with its errors answered as gRPC statuses, and its calls logged."""

    @functools.wraps(handler)
    def unary(request: Any, context: Any) -> Any:
        start = time.perf_counter()
        what = getattr(request, "model_name", "") or getattr(request, "name", "")
        try:
            response = handler(request, context)
        except FlowrtError as e:
            _log(name, what, _code(e).name, start)
            context.abort(_code(e), str(e))
        except trio.RunFinishedError:
            _log(name, what, "UNAVAILABLE", start)
            context.abort(grpc.StatusCode.UNAVAILABLE, "the server is shutting down")
        except Exception as e:  # a bug of ours: answered, logged, the server goes on
            logger.exception("grpc %s failed", name)
            context.abort(grpc.StatusCode.INTERNAL, f"{type(e).__name__}: {e}")
        _log(name, what, "OK", start)
        return response

    return unary


def start(
    server: Server, token: trio.lowlevel.TrioToken, host: str, port: int, max_message_bytes: int
) -> Any:
    """A started grpcio server on ``host:port`` (0: a free port), and the port it took."""
    servicer = Servicer(server, token)
    for method in pb.DESCRIPTOR.services_by_name["GRPCInferenceService"].methods:
        if method.name != "ModelStreamInfer" and hasattr(Servicer, method.name):
            setattr(servicer, method.name, _answered(method.name, getattr(servicer, method.name)))
    grpc_server = grpc.server(
        ThreadPoolExecutor(max_workers=THREADS, thread_name_prefix="flowrt-grpc"),
        options=[
            ("grpc.max_receive_message_length", max_message_bytes),
            ("grpc.max_send_message_length", -1),
            ("grpc.so_reuseport", 0),
        ],
    )
    pb_grpc.add_GRPCInferenceServiceServicer_to_server(servicer, grpc_server)
    try:
        bound = grpc_server.add_insecure_port(f"{host}:{port}")
    except RuntimeError as e:
        raise InputError(f"flowrt serve cannot listen for gRPC on {host}:{port}: {e}") from None
    if not bound:
        raise InputError(f"flowrt serve cannot listen for gRPC on {host}:{port}")
    grpc_server.start()
    return grpc_server, bound
