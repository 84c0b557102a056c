"""The KServe v2 inference protocol over HTTP as Triton speaks it: JSON tensors, and Triton's
binary tensor data extension (what ``tritonclient.http`` sends by default).

A request body is JSON, or JSON followed by raw tensor bytes, the JSON's length given by the
``Inference-Header-Content-Length`` header; an input whose ``parameters`` hold
``binary_data_size`` takes its bytes from there, in order. An output is returned as raw bytes
after the JSON when the request asks for it (the output's ``binary_data`` parameter, or the
request's ``binary_data_output``), else as a JSON list. Malformed requests raise
:class:`BadRequest` naming what was expected and what was found.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import numpy as np

from flowrt.errors import InputError
from flowrt.types import TensorInfo

HEADER_LENGTH = "inference-header-content-length"

DATATYPES: dict[str, np.dtype] = {
    "BOOL": np.dtype(np.bool_),
    "UINT8": np.dtype(np.uint8),
    "UINT16": np.dtype(np.uint16),
    "UINT32": np.dtype(np.uint32),
    "UINT64": np.dtype(np.uint64),
    "INT8": np.dtype(np.int8),
    "INT16": np.dtype(np.int16),
    "INT32": np.dtype(np.int32),
    "INT64": np.dtype(np.int64),
    "FP16": np.dtype(np.float16),
    "FP32": np.dtype(np.float32),
    "FP64": np.dtype(np.float64),
}
_NAMES = {dtype: name for name, dtype in DATATYPES.items()}


# The protocol's extensions the server speaks (server metadata lists them).
EXTENSIONS = ("binary_tensor_data", "model_repository")


def server_version() -> str:
    import flowrt

    return flowrt.__version__


def datatype_of(dtype: np.dtype) -> str:
    """The protocol's name of a numpy element type."""
    return _NAMES.get(np.dtype(dtype), "BYTES")


class BadRequest(InputError):
    """A request the protocol or the model does not take (HTTP 400)."""


def datatype(info: TensorInfo) -> str:
    """The protocol's name of a tensor's element type."""
    return datatype_of(info.dtype.numpy)


def shape(info: TensorInfo, batching: bool) -> list[int]:
    """A tensor's shape as metadata reports it: -1 for unknown dims and, where the model
    batches, for the leading one."""
    dims = [d if isinstance(d, int) else -1 for d in info.shape or ()]
    if batching and dims:
        dims[0] = -1
    return dims


def _json(data: bytes) -> Any:
    try:
        return json.loads(data)
    except (ValueError, UnicodeDecodeError) as e:
        raise BadRequest(f"the request's JSON does not parse: {e}") from None


def check_input(
    name: str, given: Any, dims: Any, inputs: Mapping[str, TensorInfo], feeds: Mapping[str, Any]
) -> tuple[np.dtype, int]:
    """(element type, element count) of input ``name`` of datatype ``given`` and shape
    ``dims``, checked against the model's ``inputs`` and the ``feeds`` taken so far."""
    if name not in inputs:
        raise BadRequest(f"unknown input {name!r}; the model's inputs are {sorted(inputs)}")
    if name in feeds:
        raise BadRequest(f"input {name!r} is given twice")
    if not isinstance(dims, list) or not all(
        isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in dims
    ):
        raise BadRequest(f"input {name!r}: 'shape' must be a list of non-negative integers, got {dims!r}")
    expected = datatype(inputs[name])
    if given != expected:
        raise BadRequest(f"input {name!r}: datatype {given!r}, expected {expected!r}")
    if expected not in DATATYPES:
        raise BadRequest(f"input {name!r} holds {expected} tensors, which flowrt serve does not take")
    return DATATYPES[expected], int(np.prod(dims, dtype=np.int64))


def missing_inputs(inputs: Mapping[str, TensorInfo], feeds: Mapping[str, Any]) -> None:
    """BadRequest when a request leaves out one of the model's ``inputs``."""
    missing = sorted(set(inputs) - set(feeds))
    if missing:
        raise BadRequest(f"inputs {missing} are missing; the model takes {sorted(inputs)}")


def parse_infer(
    body: bytes, header_length: str | None, inputs: Mapping[str, TensorInfo]
) -> tuple[dict, dict[str, np.ndarray]]:
    """(the request's JSON, its feeds) checked against the model's ``inputs``."""
    if header_length is not None:
        try:
            length = int(header_length)
        except ValueError:
            raise BadRequest(
                f"Inference-Header-Content-Length must be an integer, got {header_length!r}"
            ) from None
        if not 0 <= length <= len(body):
            raise BadRequest(
                f"Inference-Header-Content-Length {length} is outside the body's {len(body)} bytes"
            )
        request, binary = _json(body[:length]), memoryview(body)[length:]
    else:
        request, binary = _json(body), memoryview(b"")
    if not isinstance(request, dict) or not isinstance(request.get("inputs"), list):
        raise BadRequest("an inference request is a JSON object with a list of 'inputs'")
    feeds: dict[str, np.ndarray] = {}
    offset = 0
    for entry in request["inputs"]:
        if not isinstance(entry, dict) or not isinstance(entry.get("name"), str):
            raise BadRequest(f"each input is an object with a 'name', got {str(entry)[:80]}")
        name, dims = entry["name"], entry.get("shape")
        dtype, count = check_input(name, entry.get("datatype"), dims, inputs, feeds)
        expected = datatype(inputs[name])
        parameters = entry.get("parameters") or {}
        size = parameters.get("binary_data_size") if isinstance(parameters, dict) else None
        if size is not None:
            if not isinstance(size, int) or size != count * dtype.itemsize:
                raise BadRequest(
                    f"input {name!r}: binary_data_size {size!r}, expected {count * dtype.itemsize} for shape {dims} {expected}"
                )
            if offset + size > len(binary):
                raise BadRequest(
                    f"input {name!r}: {size} bytes of binary data announced, {len(binary) - offset} sent"
                )
            # a read-only view of the body (which it keeps alive), not a copy: feeds are only read
            array = np.frombuffer(binary[offset : offset + size], dtype).reshape(dims)
            offset += size
        else:
            if "data" not in entry:
                raise BadRequest(f"input {name!r}: neither 'data' nor a binary_data_size parameter")
            try:
                array = np.asarray(entry["data"], dtype)
            except (TypeError, ValueError) as e:
                raise BadRequest(f"input {name!r}: 'data' is not a list of {expected} values: {e}") from None
            if array.size != count:
                raise BadRequest(f"input {name!r}: {array.size} values for shape {dims}, which holds {count}")
            array = array.reshape(dims)
        feeds[name] = array
    if offset != len(binary):
        raise BadRequest(f"{len(binary) - offset} bytes of binary data after the inputs that announce theirs")
    missing_inputs(inputs, feeds)
    return request, feeds


def requested_outputs(request: dict, outputs: Mapping[str, TensorInfo]) -> list[tuple[str, bool]]:
    """(name, as binary) of each output to return: those the request names, else all."""
    parameters = request.get("parameters") or {}
    binary_default = (
        bool(parameters.get("binary_data_output", False)) if isinstance(parameters, dict) else False
    )
    asked = request.get("outputs")
    if asked is None:
        return [(name, binary_default) for name in outputs]
    if not isinstance(asked, list):
        raise BadRequest("'outputs' must be a list of objects with a 'name'")
    chosen = []
    for entry in asked:
        name = entry.get("name") if isinstance(entry, dict) else None
        if not isinstance(name, str) or name not in outputs:
            raise BadRequest(f"unknown output {name!r}; the model's outputs are {sorted(outputs)}")
        own = entry.get("parameters") or {}
        chosen.append(
            (name, bool(own.get("binary_data", binary_default)) if isinstance(own, dict) else binary_default)
        )
    return chosen


def infer_response(
    model: str, version: int, request: dict, values: Mapping[str, np.ndarray], chosen: list[tuple[str, bool]]
) -> tuple[bytes, dict[str, str]]:
    """The response body and its headers."""
    outputs, blobs = [], []
    for name, binary in chosen:
        value = np.ascontiguousarray(values[name])
        entry: dict[str, Any] = {
            "name": name,
            "datatype": datatype_of(value.dtype),
            "shape": list(value.shape),
        }
        if binary:
            blob = value.tobytes()
            entry["parameters"] = {"binary_data_size": len(blob)}
            blobs.append(blob)
        else:
            entry["data"] = value.reshape(-1).tolist()
        outputs.append(entry)
    response: dict[str, Any] = {"model_name": model, "model_version": str(version), "outputs": outputs}
    if "id" in request:
        response["id"] = request["id"]
    head = json.dumps(response).encode()
    if not blobs:
        return head, {"content-type": "application/json"}
    return head + b"".join(blobs), {"content-type": "application/octet-stream", HEADER_LENGTH: str(len(head))}
