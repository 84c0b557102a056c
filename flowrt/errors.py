"""The exception tree of flowrt.

Every error flowrt raises on purpose is a :class:`FlowrtError`. Messages say what was
expected, what was found, and where.
"""

from __future__ import annotations


class FlowrtError(Exception):
    """Base of every error flowrt raises on purpose."""


class ModelLoadError(FlowrtError):
    """A model file is missing, unreadable, malformed or not a valid graph."""


class GraphError(FlowrtError):
    """A network is not a valid graph: a cycle, an unconnected slot, a duplicate name."""


class UnsupportedLayerError(FlowrtError):
    """No backend in the preference list accepts a layer, or the front end does not know an op."""


class ShapeError(FlowrtError):
    """A tensor shape does not match what a layer or a network input expects."""


class DataTypeError(FlowrtError):
    """A tensor data type does not match what a layer or a network input expects."""


class InputError(FlowrtError):
    """Feeds name an input the network does not have, or miss one it needs."""


class BackendError(FlowrtError):
    """A backend failed to register, load or build."""


class RunError(FlowrtError):
    """A workload failed while running; names the layer, its backend and the cause — and the
    pipeline stage, for a run through a ``flowrt.Pipeline`` (``layer`` and ``backend`` are
    None when the stage is a function, or failed before a layer ran)."""

    def __init__(
        self, layer: str | None, backend: str | None, cause: BaseException, *, stage: str | None = None
    ) -> None:
        self.layer = layer
        self.backend = backend
        self.cause = cause
        self.stage = stage
        where = [] if stage is None else [f"pipeline stage {stage!r}"]
        if layer is not None:
            where.append(f"layer {layer!r} on backend {backend}")
        super().__init__(f"{': '.join(where)} failed: {type(cause).__name__}: {cause}")


class ResourceError(FlowrtError):
    """A memory or capacity limit was reached."""


__all__ = [
    "BackendError",
    "DataTypeError",
    "FlowrtError",
    "GraphError",
    "InputError",
    "ModelLoadError",
    "ResourceError",
    "RunError",
    "ShapeError",
    "UnsupportedLayerError",
]
