"""GpuAcc's tuning levels, apart from the tuner so that naming one imports no OpenCL."""

from __future__ import annotations

import enum
from typing import Any

from flowrt.errors import BackendError


class TuningMode(enum.Enum):
    """How hard the tuner looks: CLTuner's levels."""

    NONE = "none"
    RAPID = "rapid"
    NORMAL = "normal"
    EXHAUSTIVE = "exhaustive"

    @classmethod
    def parse(cls, value: Any) -> TuningMode:
        """A mode from a TuningMode or its name (any case); BackendError for anything else."""
        if isinstance(value, TuningMode):
            return value
        try:
            return cls(str(value).lower())
        except ValueError:
            names = ", ".join(m.value for m in cls)
            raise BackendError(f"tuning_mode must be one of {names}; got {value!r}") from None
