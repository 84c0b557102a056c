"""CpuAcc: the fast CPU backend — numba kernels whose execution windows split across workers.

``import flowrt`` registers this class, and making one loads nothing of numba: its layer
support and workload factory are imported when first asked for, and they load the kernels
(``flowrt.workers.cpu.acc.kernels``), which import numba and choose its threading layer.
"""

from __future__ import annotations

import contextlib
import functools
from typing import TYPE_CHECKING, Any

from flowrt.engine.graph.passes.fusions import EPILOGUE_ACTIVATION_KINDS
from flowrt.engine.memory.manager import MemoryManager
from flowrt.registry import DefaultRank

if TYPE_CHECKING:
    from flowrt.registry import OptimizationViews
    from flowrt.workers.cpu.acc.layer_support import AccLayerSupport
    from flowrt.workers.cpu.acc.workload_factory import AccWorkloadFactory

# In the default list on every machine, after GpuAcc and before CpuRef.
DEFAULT_RANK = DefaultRank(20)

# The kinds whose numba kernels apply a fused activation in their epilogue: the same as GpuAcc's.
FUSED_ACTIVATION_KINDS = EPILOGUE_ACTIVATION_KINDS
# Kinds whose constant weights it stores in float16 with reduce_fp32_to_fp16: the forms its
# register tiles read (on CPUs without them BLAS multiplies float32 forms, as do the convs'
# BLAS paths).
FP16_WEIGHT_KINDS = frozenset({"Conv", "FusedConv", "Gemm", "MatMul", "MatMulBias"})


class AccBackend:
    """numba kernels, ``nogil`` and cached; shares host memory with CpuRef."""

    id = "CpuAcc"
    version = (0, 1)

    def __init__(self, workers: int | None = None) -> None:
        # Here, not at the top: the worker pool's module imports trio, which optimizing does not need.
        from flowrt.workers.cpu.workers import default_cpu_workers

        self.workers = workers or default_cpu_workers()

    @property
    def capabilities(self) -> dict[str, Any]:
        return {
            "host_memory": True,
            "zero_copy_host": True,
            "async_execution": False,
            "fp16": False,
            # The layer kinds whose constant float32 weights it keeps as float16, computing in
            # float32, when the network is optimized with reduce_fp32_to_fp16 (``half.py``).
            "fp16_weights": FP16_WEIGHT_KINDS,
            "window_split": True,
            # Arenas may come from Runtime(allocators={"CpuAcc": ...}).
            "custom_allocator": True,
            # Kernels that apply an activation as they store (epilogue.activate).
            "fused_activation": FUSED_ACTIVATION_KINDS,
            # Integer kernels for QLinearConv, QLinearMatMul and QGemm (kernels/qlinear.py): the
            # optimizer folds a QDQ model's groups into them (passes/fold_qdq.py).
            "quantized_kernels": True,
        }

    def layer_support(self) -> AccLayerSupport:
        from flowrt.workers.cpu.acc.layer_support import AccLayerSupport

        return AccLayerSupport()

    def optimize_subgraph(self, view: Any) -> OptimizationViews:
        """MatMul + bias Add (+ activation) as one Gemm, Conv + residual Add (+ activation)
        as one FusedConv, an activation fused into the layer before it (Conv + bias + Relu as
        one Conv), and activations and norms written out of small ops as one layer
        (``PATTERN_FUSIONS``): see ``offer_fusions``."""
        from flowrt.engine.graph.layer_kind import activation_kinds
        from flowrt.engine.graph.passes.fusions import conv_residual, offer_fusions
        from flowrt.engine.graph.passes.pattern_fusions import PATTERN_FUSIONS

        # The curves too: the epilogue has every code of the activation table.
        activations = activation_kinds("everywhere", "curve")
        residual = functools.partial(conv_residual, activations=activations)
        patterns = (*PATTERN_FUSIONS, residual)
        return offer_fusions(view, self.layer_support(), FUSED_ACTIVATION_KINDS, patterns, activations)

    def create_memory_manager(self) -> MemoryManager:
        return MemoryManager()

    def compile_ahead(self, network: Any, job: Any = None) -> contextlib.ExitStack:
        """Around the building of a load's workloads: the kernels an earlier load of
        ``network`` needed are loaded from numba's cache at once, and its layers need not run
        to warm up (``flowrt.workers.cpu.acc.preload``); on an empty kernel cache, a second
        process compiles its kernels from its last layer back while the load compiles them
        in order (``flowrt.workers.cpu.acc.compile_ahead``). ``job``: the load's
        ``JobContext``, whose threads the layers plan by."""
        from flowrt.workers.cpu.acc.compile_ahead import CompileAhead
        from flowrt.workers.cpu.acc.preload import Preload

        threads = job.threads if job is not None else self.workers
        stack = contextlib.ExitStack()
        stack.enter_context(CompileAhead(network, self.workers, threads))
        stack.enter_context(Preload(network, threads))
        return stack

    def create_workload_factory(self, memory_manager: Any = None) -> AccWorkloadFactory:
        from flowrt.workers.cpu.acc.workload_factory import AccWorkloadFactory

        return AccWorkloadFactory(memory_manager, self.workers)
