"""ONNX Runtime's exception names, where ONNX Runtime code imports them from
(``onnxruntime.capi.onnxruntime_pybind11_state``); ``flowrt.ort_compat.exceptions`` is the
same module's names. Each is the flowrt errors ONNX Runtime raises that exception for, so
``except InvalidArgument:`` and ``except (InvalidArgument, Fail):`` catch flowrt's errors as
they caught ONNX Runtime's.

They are tuples of flowrt error classes, which ``except``, ``isinstance`` and
``pytest.raises`` take as a class: catch them, never raise them. A tuple may hold a class
that ONNX Runtime splits further (a ModelLoadError is an empty, truncated or missing model
file alike), so it catches at least what ONNX Runtime's exception would. Python's own bases
work too: bad feeds are ValueErrors, failed runs and backends RuntimeErrors (see
``flowrt.errors``). Light to import: flowrt's error classes only.
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

# ONNX Runtime says INVALID_ARGUMENT for bad feeds and names, and for some models it cannot
# load: an empty file, a node reading a tensor nothing produces.
InvalidArgument = (InputError, ShapeError, DataTypeError, ArgumentError, ModelLoadError)
Fail = (RunError, BackendError, ResourceError)  # a layer that fails while running, among others
RuntimeException = (RunError, ResourceError)
EPFail = (BackendError,)
NoSuchFile = (ModelLoadError,)
NoModel = (ModelLoadError,)
InvalidProtobuf = (ModelLoadError,)  # a file or bytes that are not an ONNX protobuf
InvalidGraph = (GraphError, ModelLoadError)  # a model onnx's checker refuses
NotImplemented = (UnsupportedLayerError,)  # noqa: A001  (ONNX Runtime's name)
EngineError = (FlowrtError,)
# What flowrt never does: load a model twice, cancel a load, compile ahead, reset a device,
# look up what is not there by this route.
ModelLoaded: tuple = ()
ModelLoadCanceled: tuple = ()
ModelRequiresCompilation: tuple = ()
DeviceReset: tuple = ()
NotFound: tuple = ()

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
