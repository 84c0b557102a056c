"""Which layers CpuRef runs: every kind it has a numpy kernel for, on every data type.

The low-precision types (bfloat16, float8, float4, int4, int2) are ``ml_dtypes`` arrays, which
numpy computes with; each layer kind's type inference already limits them to the operators
ONNX allows them in (Cast, QuantizeLinear, data movement, and bfloat16 arithmetic).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from flowrt.registry import Support
from flowrt.types import TensorInfo
from flowrt.workers.cpu.ref.kernels import load_all


class RefLayerSupport:
    """CpuRef's answers: a kernel must exist."""

    def is_layer_supported(
        self,
        kind: str,
        descriptor: Any,
        inputs: Sequence[TensorInfo | None],
        outputs: Sequence[TensorInfo | None],
    ) -> Support:
        if kind not in load_all():
            return Support.no(f"no CpuRef kernel for {kind}")
        return Support.yes()
