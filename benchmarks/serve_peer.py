"""The peer of ``benchmarks/serve.py``: the inference server people write today, FastAPI on
uvicorn around one ONNX Runtime session, speaking as much of the KServe v2 protocol as
Triton's HTTP client needs.

    python benchmarks/serve_peer.py MODEL.onnx --name NAME [--host 127.0.0.1] [--port 8001]

One uvicorn worker process (uvloop and httptools where installed, as ``uvicorn[standard]``
and ``fastapi[standard]`` install them) serves one ``onnxruntime.InferenceSession``
(CPUExecutionProvider, ONNX Runtime's default session options) under the model name
``--name``:

- ``GET /v2/health/live``, ``GET /v2/health/ready``, ``GET /v2/models/{name}/ready``;
- ``GET /v2/models/{name}``: the model's metadata (inputs and outputs, datatypes, shapes);
- ``POST /v2/models/{name}/infer``: inputs as JSON lists or, with Triton's binary tensor data
  extension, as raw bytes after a JSON header whose length is the
  ``Inference-Header-Content-Length`` header (an input's ``parameters.binary_data_size``
  announcing its bytes, in order); outputs as raw bytes after the JSON where the request asks
  for them (an output's ``binary_data`` parameter or the request's ``binary_data_output``),
  else as JSON lists. Errors are answered as Triton does, ``{"error": "..."}``.

The handler parses the request on the event loop and runs ``session.run`` in Starlette's
thread pool (``run_in_threadpool``), the usual way a FastAPI app keeps a blocking call off
its loop; requests are not batched together. SIGTERM stops it.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

import numpy as np
import onnxruntime as ort
import uvicorn
from fastapi import FastAPI, Request, Response
from fastapi.responses import JSONResponse
from starlette.concurrency import run_in_threadpool

from flowrt.serve.protocol import infer_response, requested_outputs

HEADER_LENGTH = "Inference-Header-Content-Length"
DATATYPES = {
    "BOOL": np.bool_,
    "UINT8": np.uint8,
    "UINT16": np.uint16,
    "UINT32": np.uint32,
    "UINT64": np.uint64,
    "INT8": np.int8,
    "INT16": np.int16,
    "INT32": np.int32,
    "INT64": np.int64,
    "FP16": np.float16,
    "FP32": np.float32,
    "FP64": np.float64,
}
ONNX_TYPES = {f"tensor({np.dtype(t).name})": name for name, t in DATATYPES.items()}
ONNX_TYPES.update({"tensor(bool)": "BOOL", "tensor(float)": "FP32", "tensor(double)": "FP64"})


def _tensors(args: list[Any]) -> list[dict[str, Any]]:
    return [
        {
            "name": a.name,
            "datatype": ONNX_TYPES.get(a.type, "BYTES"),
            "shape": [d if isinstance(d, int) else -1 for d in a.shape],
        }
        for a in args
    ]


def parse_request(body: bytes, header_length: str | None) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """(the request's JSON, its inputs as arrays)."""
    length = int(header_length) if header_length is not None else len(body)
    request = json.loads(body[:length])
    binary = memoryview(body)[length:]
    feeds, offset = {}, 0
    for entry in request["inputs"]:
        dtype = np.dtype(DATATYPES[entry["datatype"]])
        size = (entry.get("parameters") or {}).get("binary_data_size")
        if size is not None:
            array = np.frombuffer(binary[offset : offset + size], dtype)
            offset += size
        else:
            array = np.asarray(entry["data"], dtype)
        feeds[entry["name"]] = array.reshape(entry["shape"])
    return request, feeds


def make_response(name: str, request: dict[str, Any], values: dict[str, np.ndarray]) -> Response:
    """The response to ``request`` with the model's outputs ``values``, encoded as flowrt serve
    encodes its own (``flowrt.serve.protocol``: the same bytes on the wire)."""
    chosen = requested_outputs(request, dict.fromkeys(values))
    body, headers = infer_response(name, 1, request, values, chosen)
    return Response(body, headers=headers)


def make_app(path: str, name: str) -> FastAPI:
    session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    output_names = [o.name for o in session.get_outputs()]
    metadata = {
        "name": name,
        "versions": ["1"],
        "platform": "onnxruntime_onnx",
        "inputs": _tensors(session.get_inputs()),
        "outputs": _tensors(session.get_outputs()),
    }
    app = FastAPI()

    def unknown(model: str) -> Response | None:
        if model == name:
            return None
        return JSONResponse({"error": f"unknown model {model!r}; the server holds {name!r}"}, 404)

    @app.get("/v2/health/live")
    @app.get("/v2/health/ready")
    def health() -> Response:
        return Response()

    @app.get("/v2/models/{model}/ready")
    def model_ready(model: str) -> Response:
        return unknown(model) or Response()

    @app.get("/v2/models/{model}")
    def model_metadata(model: str) -> Response:
        return unknown(model) or JSONResponse(metadata)

    @app.post("/v2/models/{model}/infer")
    async def infer(model: str, request: Request) -> Response:
        missing = unknown(model)
        if missing:
            return missing
        try:
            parsed, feeds = parse_request(await request.body(), request.headers.get(HEADER_LENGTH))
        except (ValueError, KeyError, TypeError) as e:
            return JSONResponse({"error": f"bad inference request: {type(e).__name__}: {e}"}, 400)
        try:
            values = await run_in_threadpool(session.run, None, feeds)
        except Exception as e:  # ONNX Runtime's errors (a wrong shape or type): answered
            return JSONResponse({"error": f"{type(e).__name__}: {e}"}, 400)
        return make_response(name, parsed, dict(zip(output_names, values)))

    return app


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("model", help="an ONNX file")
    parser.add_argument("--name", required=True, help="the model's name in the routes")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8001)
    args = parser.parse_args()
    app = make_app(args.model, args.name)
    config = uvicorn.Config(app, host=args.host, port=args.port, workers=1, log_level="warning")
    uvicorn.Server(config).run()


if __name__ == "__main__":
    main()
