"""flowrt: an asynchronous dataflow inference engine for neural networks, built on trio.

::

    net = flowrt.onnx.load("model.onnx")
    opt = flowrt.optimize(net, backends=["CpuRef"])
    async with flowrt.Runtime() as rt:
        model = await rt.load(opt)
        outputs = await model.run({"data": x})

``import flowrt`` loads what builds, saves and optimizes a network (numpy, attrs and the graph
engine). What runs one is imported when one of its names is first used: ``Runtime``,
``InferenceSession``, ``Pipeline``, ``LoadedNetwork`` and ONNX Runtime's names
(``flowrt.ort_compat``), whose modules import trio (about 0.1 s, most of what import would
cost); and further down, onnx when a model is first parsed, numba when CpuAcc first looks at
a layer or a runtime starts its CPU workers, OpenCL when a GpuAcc backend is made. Importing
flowrt changes nothing process-wide (environment, threading layers, BLAS threads): see
``flowrt.workers.cpu.threading_layer`` for when that happens.
"""

import importlib
from typing import TYPE_CHECKING, Any

from flowrt import descriptors, errors, onnx, profiling
from flowrt.engine.graph.network import Network
from flowrt.engine.graph.optimizer import OptimizedNetwork, OptimizerOptions
from flowrt.engine.graph.passes.batch import set_batch
from flowrt.network_cache import optimize
from flowrt.registry import BackendId, BackendRegistry, backend_registry
from flowrt.serialize import load, save
from flowrt.types import DataType, Priority, TensorInfo
from flowrt.workers.cpu.acc import AccBackend
from flowrt.workers.cpu.acc.backend import DEFAULT_RANK as _ACC_RANK
from flowrt.workers.cpu.ref import RefBackend
from flowrt.workers.cpu.ref.backend import DEFAULT_RANK as _REF_RANK
from flowrt.workers.gpu.backend_default import DEFAULT_RANK as _GPU_RANK

if TYPE_CHECKING:
    from flowrt.engine.scheduler.device_array import DeviceArray
    from flowrt.loaded_network import LoadedNetwork
    from flowrt.ort_compat import (
        ExecutionMode,
        ExecutionOrder,
        GraphOptimizationLevel,
        IOBinding,
        ModelMetadata,
        OrtValue,
        RunOptions,
        SessionOptions,
        get_all_providers,
        get_available_providers,
        get_device,
        get_version_string,
        set_default_logger_severity,
    )
    from flowrt.pipeline import Pipeline
    from flowrt.runtime import Runtime
    from flowrt.session import InferenceSession, NodeArg
    from flowrt.workers.gpu.backend import GpuAccBackend

# Public names imported on first use (PEP 562), by module: see the module doc.
_ON_FIRST_USE = {
    "LoadedNetwork": "flowrt.loaded_network",
    "DeviceArray": "flowrt.engine.scheduler.device_array",
    "Pipeline": "flowrt.pipeline",
    "Runtime": "flowrt.runtime",
    "InferenceSession": "flowrt.session",
    "NodeArg": "flowrt.session",
    "GpuAccBackend": "flowrt.workers.gpu.backend",
    "capi": "flowrt.capi",  # a module: ONNX Runtime's exception names at their ORT path
    **dict.fromkeys(
        (
            "ExecutionMode",
            "ExecutionOrder",
            "GraphOptimizationLevel",
            "IOBinding",
            "ModelMetadata",
            "OrtValue",
            "RunOptions",
            "SessionOptions",
            "get_all_providers",
            "get_available_providers",
            "get_device",
            "get_version_string",
            "set_default_logger_severity",
        ),
        "flowrt.ort_compat",
    ),
}

__version__ = "0.1.0"


def _gpu_acc() -> Any:
    """GpuAcc's factory: OpenCL is imported when a GpuAcc backend is first made, not here."""
    from flowrt.workers.gpu.backend import GpuAccBackend

    return GpuAccBackend()


# Each with its place in the default list (GpuAcc's asks OpenCL when a default is first built).
for _id, _factory, _rank in (
    ("CpuRef", RefBackend, _REF_RANK),
    ("CpuAcc", AccBackend, _ACC_RANK),
    ("GpuAcc", _gpu_acc, _GPU_RANK),
):
    if not backend_registry().is_registered(_id):
        backend_registry().register(_id, _factory, _rank)


def __getattr__(name: str) -> Any:
    module = _ON_FIRST_USE.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    imported = importlib.import_module(module)
    value = imported if module == f"{__name__}.{name}" else getattr(imported, name)
    globals()[name] = value  # later look-ups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_ON_FIRST_USE))


__all__ = [
    "AccBackend",
    "BackendId",
    "BackendRegistry",
    "DataType",
    "DeviceArray",
    "ExecutionMode",
    "ExecutionOrder",
    "GpuAccBackend",
    "GraphOptimizationLevel",
    "IOBinding",
    "InferenceSession",
    "LoadedNetwork",
    "ModelMetadata",
    "Network",
    "NodeArg",
    "OptimizedNetwork",
    "OptimizerOptions",
    "OrtValue",
    "Pipeline",
    "Priority",
    "RefBackend",
    "RunOptions",
    "Runtime",
    "SessionOptions",
    "TensorInfo",
    "backend_registry",
    "descriptors",
    "errors",
    "get_all_providers",
    "get_available_providers",
    "get_device",
    "get_version_string",
    "load",
    "onnx",
    "optimize",
    "profiling",
    "save",
    "set_batch",
    "set_default_logger_severity",
]
