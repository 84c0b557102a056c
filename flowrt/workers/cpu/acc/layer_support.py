"""Which layers CpuAcc runs: those with a numba kernel that accepts the layer's types and attributes."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from flowrt.registry import Support, WorkloadInfo
from flowrt.types import TensorInfo
from flowrt.workers.cpu.acc.kernels import kernel_for


class AccLayerSupport:
    """CpuAcc's answers; a layer it declines falls back to the next backend, with this reason."""

    def is_layer_supported(
        self,
        kind: str,
        descriptor: Any,
        inputs: Sequence[TensorInfo | None],
        outputs: Sequence[TensorInfo | None],
    ) -> Support:
        kernel = kernel_for(kind)
        if kernel is None:
            return Support.no(f"no CpuAcc kernel for {kind}")
        return kernel.supports(WorkloadInfo("", kind, descriptor, tuple(inputs), tuple(outputs)))  # type: ignore[arg-type]  # inferred outputs are never None
