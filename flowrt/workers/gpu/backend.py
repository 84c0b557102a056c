"""GpuAcc: the OpenCL backend — kernels built once per device, queues owned by actors."""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator
from typing import Any

from flowrt.engine.graph.passes.attention_fusions import ATTENTION_FUSIONS
from flowrt.engine.graph.passes.fusions import (
    EPILOGUE_ACTIVATION_KINDS,
    conv_residual,
    gemm_on_rows,
    matmul_residual,
    offer_fusions,
)
from flowrt.engine.graph.passes.pattern_fusions import PATTERN_FUSIONS
from flowrt.engine.memory.manager import MemoryManager
from flowrt.errors import BackendError
from flowrt.registry import OptimizationViews
from flowrt.workers.gpu import device
from flowrt.workers.gpu.allocator import device_memory_manager
from flowrt.workers.gpu.backend_context import GpuBackendContext
from flowrt.workers.gpu.context import device_context
from flowrt.workers.gpu.kernels import activation_codes
from flowrt.workers.gpu.layer_support import GpuLayerSupport
from flowrt.workers.gpu.tuner import Tuner
from flowrt.workers.gpu.workload_factory import GpuWorkloadFactory

# The kinds whose kernels apply a fused activation in their own store (gemm.cl's epilogue,
# elementwise.cl's): the same as CpuAcc's.
FUSED_ACTIVATION_KINDS = EPILOGUE_ACTIVATION_KINDS


class GpuAccBackend:
    """OpenCL kernels on one device (``opencl_device``, else ``FLOWRT_OPENCL_DEVICE``, else the
    first GPU: a CPU OpenCL device only when named); stateless: the device's context and
    programs are shared per process.

    Making one never touches OpenCL, so it is safe where there is none: its layer support then
    declines every layer with the reason, and ``check_available`` (which ``flowrt.optimize``
    calls when GpuAcc is named in its list) raises it. A runtime configures the object it holds through
    ``create_context(options)``: ``options.opencl_device``, when set, picks the device, and
    ``options.tuning_file`` / ``options.tuning_mode`` make the tuner its kernels take their
    local work sizes from (see ``flowrt.workers.gpu.tuner``).
    Its memory lives on the device (``host_memory`` False): the runtime runs its workloads as
    GPU segments on the context's queue actors and copies to the host only where a host
    backend, or the caller, reads a GpuAcc tensor.
    """

    id = "GpuAcc"
    version = (0, 1)

    def __init__(self, opencl_device: str | None = None) -> None:
        self.opencl_device = opencl_device
        self.tuner = Tuner()

    @property
    def capabilities(self) -> dict[str, Any]:
        return {
            "host_memory": False,
            "async_execution": True,
            # reduce_fp32_to_fp16: the layers whose kernels store tensors as half (GpuKernel.
            # half_storage) run in float16, computing in float; Casts at their borders.
            "fp16": True,
            "fused_activation": FUSED_ACTIVATION_KINDS,
        }

    def check_available(self) -> None:
        """BackendError where this machine has no OpenCL device at all, saying so: GpuAcc named
        in a backend list must not turn silently into the next backend. Which device it runs
        on is the runtime's choice (``opencl_device``), so an unnamed CPU device is refused
        when a runtime loads the network, not here."""
        if device.unavailable_reason():
            raise BackendError(device.gpu_needed_message(self.id))

    def layer_support(self) -> GpuLayerSupport:
        return GpuLayerSupport()

    def optimize_subgraph(self, view: Any) -> OptimizationViews:
        """MatMul + bias Add (+ activation) as one Gemm or MatMulBias, Conv + residual Add
        (+ activation) as one FusedConv, MatMul or MatMulBias + residual Add as one MatMulBias
        with Z (a transformer's residual connections, added in the GEMM's epilogue), an
        activation fused into the layer before it (Conv + bias + Relu as one Conv; the
        activations of common.cl's ``activate``), and the activations and normalizations
        written out of small ops that GpuAcc runs as one layer (``PATTERN_FUSIONS``: Gelu,
        Swish, LayerNormalization, RMSNormalization), attention's scale, mask and Softmax as
        one AttentionSoftmax, its head splits read (and its heads' merge written) in place by a
        TransposedMatMul and its rotary
        embedding as one ApplyRotary (``ATTENTION_FUSIONS``): see ``offer_fusions``."""
        return offer_fusions(
            view,
            self.layer_support(),
            FUSED_ACTIVATION_KINDS,
            patterns=(
                *PATTERN_FUSIONS,
                conv_residual,
                matmul_residual,
                functools.partial(gemm_on_rows, activations=activation_codes()),
                *ATTENTION_FUSIONS,
            ),
            activations=activation_codes(),
        )

    def create_context(self, options: Any = None) -> GpuBackendContext:
        """The runtime's GpuAcc context: the device ``options.opencl_device`` names (this
        backend object keeps the choice, for the memory manager and workload factory it makes
        next) and its queue actors, which the runtime starts. A tuning file that cannot be
        used raises BackendError here, naming the file and the problem."""
        spec = getattr(options, "opencl_device", None)
        if spec is not None:
            self.opencl_device = spec
        mode = getattr(options, "tuning_mode", None) or "none"
        self.tuner = Tuner(mode, getattr(options, "tuning_file", None))
        context = device_context(self.opencl_device)
        self.tuner.check_device(context.device)
        return GpuBackendContext(context)

    @contextlib.contextmanager
    def compile_ahead(self, network: Any, job: Any = None) -> Iterator[None]:
        """Around the building of a load's workloads: the programs their kernels ask for build
        in the background meanwhile (``ProgramCache.request``), and the load waits for every
        one of them at the end, so that a build that fails fails the load (BackendError naming
        the program and its options)."""
        programs = device_context(self.opencl_device).programs
        with programs.collecting() as asked:
            yield
        programs.wait(asked)

    def create_memory_manager(self) -> MemoryManager:
        """One device buffer per pool arena, tensors at the device's base-address alignment."""
        return device_memory_manager(device_context(self.opencl_device))

    def create_workload_factory(self, memory_manager: Any = None) -> GpuWorkloadFactory:
        return GpuWorkloadFactory(memory_manager, device_context(self.opencl_device), self.tuner)
