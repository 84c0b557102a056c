"""ONNX Runtime's exception names (``onnxruntime.capi.onnxruntime_pybind11_state``), each the
flowrt errors ONNX Runtime would raise one for, so ``except InvalidArgument:`` and
``except (InvalidArgument, Fail):`` catch flowrt's errors as they caught ONNX Runtime's.

They are tuples of flowrt error classes, which ``except`` and ``isinstance`` take as a class:
catch them, never raise them. Python's own bases work too: bad feeds are ValueErrors, failed
runs and backends RuntimeErrors (see ``flowrt.errors``).
"""

from __future__ import annotations

from flowrt.errors import (
    ArgumentError,
    BackendError,
    DataTypeError,
    FlowrtError,
    GraphError,
    InputError,
    ModelLoadError,
    ResourceError,
    RunError,
    ShapeError,
    UnsupportedLayerError,
)

InvalidArgument = (InputError, ShapeError, DataTypeError, ArgumentError)
Fail = (RunError, BackendError, ResourceError)
RuntimeException = (RunError, ResourceError)
EPFail = (BackendError,)
NoSuchFile = (ModelLoadError,)
NoModel = (ModelLoadError,)
InvalidProtobuf = (ModelLoadError,)
InvalidGraph = (GraphError, ModelLoadError)
NotImplemented = (UnsupportedLayerError,)  # noqa: A001  (ONNX Runtime's name)
EngineError = (FlowrtError,)
ModelLoaded: tuple = ()  # a model loaded twice: never, in flowrt

__all__ = [
    "EPFail",
    "EngineError",
    "Fail",
    "InvalidArgument",
    "InvalidGraph",
    "InvalidProtobuf",
    "ModelLoaded",
    "NoModel",
    "NoSuchFile",
    "NotImplemented",
    "RuntimeException",
]
