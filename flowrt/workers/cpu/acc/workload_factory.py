"""CpuAcc workloads: a prepared kernel per layer."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from flowrt.errors import BackendError
from flowrt.registry import WorkloadInfo
from flowrt.workers.cpu.acc.kernels import load_all


class AccWorkload:
    """One layer's numba kernel, prepared at load; ``execute`` runs all its slices and may
    write straight into the run's planned memory."""

    writes_in_place = True

    def __init__(self, kernel: Any) -> None:
        self.kernel = kernel

    def prepare(self) -> None:
        """Kernels do their one-time work when built; nothing is left for here."""

    def execute(
        self, inputs: Sequence[np.ndarray | None], outputs: Sequence[np.ndarray] | None = None
    ) -> list[np.ndarray]:
        return self.kernel.execute(inputs, outputs)


class AccWorkloadFactory:
    """Makes CpuAcc workloads whose windows split across ``workers`` CPU workers."""

    def __init__(self, memory_manager: Any, workers: int) -> None:
        self.memory_manager = memory_manager
        self.workers = workers

    def create_workload(self, info: WorkloadInfo) -> AccWorkload:
        kernel = load_all().get(info.kind)
        if kernel is None:
            raise BackendError(f"CpuAcc has no kernel for layer {info.layer_name!r} ({info.kind})")
        return AccWorkload(kernel(info, self.workers))
