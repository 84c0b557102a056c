"""CpuRef workloads: each calls its layer kind's numpy kernel."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from flowrt.engine.graph.layers.subgraph_body import subgraphs_of
from flowrt.errors import BackendError
from flowrt.registry import WorkloadInfo
from flowrt.workers.cpu.ref.kernels import RefKernel, load_all


class RefWorkload:
    """One layer run by its numpy kernel; holds nothing between runs."""

    def __init__(self, kernel: RefKernel, info: WorkloadInfo) -> None:
        self.kernel = kernel
        self.info = info

    def prepare(self) -> None:
        """CpuRef has no one-time work: it is the plain oracle."""

    def execute(self, inputs: Sequence[np.ndarray | None]) -> list[np.ndarray]:
        result = self.kernel(self.info.descriptor, *inputs)
        outputs = result if isinstance(result, (tuple, list)) else (result,)
        return [np.asarray(o) for o in outputs[: len(self.info.outputs)]]


class RefWorkloadFactory:
    """Makes a RefWorkload per layer (a SubgraphWorkload for a layer with subgraphs: If,
    Loop, Scan); CpuRef manages no memory of its own.

    CpuRef applies no fused activation (its capabilities list none, so ``optimize`` never
    fuses one into its layers): a layer that carries one is refused, never run without it.
    """

    def __init__(self, memory_manager: Any = None) -> None:
        self.memory_manager = memory_manager

    def create_workload(self, info: WorkloadInfo) -> RefWorkload:
        kernel = load_all().get(info.kind)
        if kernel is None:
            raise BackendError(f"CpuRef has no kernel for layer {info.layer_name!r} ({info.kind})")
        if info.activation is not None:
            raise BackendError(
                f"CpuRef applies no fused activation; layer {info.layer_name!r} ({info.kind}) carries a fused "
                f"{info.activation.kind}: run the activation as a layer of its own"
            )
        if subgraphs_of(info.descriptor):
            from flowrt.workers.cpu.ref.subgraph_workload import SubgraphWorkload  # it builds on RefWorkload

            return SubgraphWorkload(kernel, info)
        return RefWorkload(kernel, info)
