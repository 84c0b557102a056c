"""ONNX Runtime's exception names (``onnxruntime.capi.onnxruntime_pybind11_state``), each the
flowrt errors ONNX Runtime would raise one for: catch them, never raise them. They live in
``flowrt.capi.onnxruntime_pybind11_state``, ONNX Runtime's place for them, which says what
each catches."""

from __future__ import annotations

from flowrt.capi.onnxruntime_pybind11_state import (
    DeviceReset,
    EngineError,
    EPFail,
    Fail,
    InvalidArgument,
    InvalidGraph,
    InvalidProtobuf,
    ModelLoadCanceled,
    ModelLoaded,
    ModelRequiresCompilation,
    NoModel,
    NoSuchFile,
    NotFound,
    NotImplemented,  # noqa: A004  (ONNX Runtime's name)
    RuntimeException,
)

__all__ = [
    "DeviceReset",
    "EPFail",
    "EngineError",
    "Fail",
    "InvalidArgument",
    "InvalidGraph",
    "InvalidProtobuf",
    "ModelLoadCanceled",
    "ModelLoaded",
    "ModelRequiresCompilation",
    "NoModel",
    "NoSuchFile",
    "NotFound",
    "NotImplemented",
    "RuntimeException",
]
