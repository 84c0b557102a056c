"""flowrt: an asynchronous dataflow inference engine for neural networks, built on trio.

::

    net = flowrt.onnx.load("model.onnx")
    opt = flowrt.optimize(net, backends=["CpuRef"])
    async with flowrt.Runtime() as rt:
        model = await rt.load(opt)
        outputs = await model.run({"data": x})
"""

from typing import Any

from flowrt import descriptors, errors, onnx, profiling
from flowrt.engine.graph.network import Network
from flowrt.engine.graph.optimizer import OptimizedNetwork, OptimizerOptions, optimize
from flowrt.engine.graph.passes.batch import set_batch
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
from flowrt.registry import BackendId, BackendRegistry, backend_registry
from flowrt.runtime import Runtime
from flowrt.serialize import load, save
from flowrt.session import InferenceSession, NodeArg
from flowrt.types import DataType, Priority, TensorInfo
from flowrt.workers.cpu.acc import AccBackend
from flowrt.workers.cpu.ref import RefBackend

__version__ = "0.1.0"


def _gpu_acc() -> Any:
    """GpuAcc's factory: OpenCL is imported when a GpuAcc backend is first made, not here."""
    from flowrt.workers.gpu.backend import GpuAccBackend

    return GpuAccBackend()


for _id, _factory in (("CpuRef", RefBackend), ("CpuAcc", AccBackend), ("GpuAcc", _gpu_acc)):
    if not backend_registry().is_registered(_id):
        backend_registry().register(_id, _factory)


def __getattr__(name: str) -> Any:
    if name == "GpuAccBackend":
        from flowrt.workers.gpu.backend import GpuAccBackend

        return GpuAccBackend
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "AccBackend",
    "BackendId",
    "BackendRegistry",
    "DataType",
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
