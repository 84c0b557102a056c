"""Which layers CpuRef runs: every kind it has a numpy kernel for, on host data types."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from flowrt.registry import Support
from flowrt.types import DataType, TensorInfo
from flowrt.workers.cpu.ref.kernels import load_all

_UNSUPPORTED_TYPES = {DataType.BFLOAT16}


class RefLayerSupport:
    """CpuRef's answers: a kernel must exist and no tensor may be of a type numpy lacks."""

    def is_layer_supported(
        self,
        kind: str,
        descriptor: Any,
        inputs: Sequence[TensorInfo | None],
        outputs: Sequence[TensorInfo | None],
    ) -> Support:
        if kind not in load_all():
            return Support.no(f"no CpuRef kernel for {kind}")
        for info in [*inputs, *outputs]:
            if info is not None and info.dtype in _UNSUPPORTED_TYPES:
                return Support.no(f"data type {info.dtype.name} is not supported")
        return Support.yes()
