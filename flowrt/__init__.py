"""flowrt: an asynchronous dataflow inference engine for neural networks, built on trio.

::

    net = flowrt.onnx.load("model.onnx")
    opt = flowrt.optimize(net, backends=["CpuRef"])
    async with flowrt.Runtime() as rt:
        model = await rt.load(opt)
        outputs = await model.run({"data": x})
"""

from flowrt import descriptors, errors, onnx, profiling
from flowrt.engine.graph.network import Network
from flowrt.engine.graph.optimizer import OptimizedNetwork, OptimizerOptions, optimize
from flowrt.engine.graph.passes.batch import set_batch
from flowrt.loaded_network import LoadedNetwork
from flowrt.pipeline import Pipeline
from flowrt.registry import BackendId, BackendRegistry, backend_registry
from flowrt.runtime import Runtime
from flowrt.serialize import load, save
from flowrt.session import InferenceSession
from flowrt.types import DataType, Priority, TensorInfo
from flowrt.workers.cpu.acc import AccBackend
from flowrt.workers.cpu.ref import RefBackend
from flowrt.workers.gpu import GpuAccBackend

__version__ = "0.1.0"

for _backend in (RefBackend, AccBackend, GpuAccBackend):
    if not backend_registry().is_registered(_backend.id):
        backend_registry().register(_backend.id, _backend)

__all__ = [
    "AccBackend",
    "BackendId",
    "BackendRegistry",
    "DataType",
    "GpuAccBackend",
    "InferenceSession",
    "LoadedNetwork",
    "Network",
    "OptimizedNetwork",
    "OptimizerOptions",
    "Pipeline",
    "Priority",
    "RefBackend",
    "Runtime",
    "TensorInfo",
    "backend_registry",
    "descriptors",
    "errors",
    "load",
    "onnx",
    "optimize",
    "profiling",
    "save",
    "set_batch",
]
