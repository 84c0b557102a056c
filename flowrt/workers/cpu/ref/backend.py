"""CpuRef: the numpy reference backend, the oracle every other backend is checked against."""

from __future__ import annotations

from typing import Any

from flowrt.engine.graph.passes.fusions import offer_fusions
from flowrt.engine.memory.manager import MemoryManager
from flowrt.registry import DefaultRank, OptimizationViews
from flowrt.workers.cpu.ref.layer_support import RefLayerSupport
from flowrt.workers.cpu.ref.workload_factory import RefWorkloadFactory

# Last in the default list: it takes every layer, so a model never fails for want of a kernel.
DEFAULT_RANK = DefaultRank(30)


class RefBackend:
    """Plain, readable numpy kernels; correct first, never clever."""

    id = "CpuRef"
    version = (1, 0)

    @property
    def capabilities(self) -> dict[str, Any]:
        return {"host_memory": True, "async_execution": False, "fp16": False, "custom_allocator": True}

    def layer_support(self) -> RefLayerSupport:
        return RefLayerSupport()

    def optimize_subgraph(self, view: Any) -> OptimizationViews:
        """One fusion, exact in float32 arithmetic order: MatMul + bias Add as one Gemm;
        every other layer stays as it is (CpuRef fuses no activations)."""
        return offer_fusions(view, self.layer_support())

    def create_memory_manager(self) -> MemoryManager:
        """Host memory, tensors packed at offsets of one arena."""
        return MemoryManager()

    def create_workload_factory(self, memory_manager: Any = None) -> RefWorkloadFactory:
        return RefWorkloadFactory(memory_manager)
