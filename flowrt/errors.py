"""The exception tree of flowrt.

Every error flowrt raises on purpose is a :class:`FlowrtError`. Messages say what was
expected, what was found, and where.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any


class FlowrtError(Exception):
    """Base of every error flowrt raises on purpose."""


class ModelLoadError(FlowrtError):
    """A model file is missing, unreadable, malformed or not a valid graph."""


class GraphError(FlowrtError):
    """A network is not a valid graph: a cycle, an unconnected slot, a duplicate name."""


class UnsupportedLayerError(FlowrtError):
    """No backend in the preference list accepts a layer, or the front end does not know an op."""


class ShapeError(FlowrtError, ValueError):
    """A tensor shape does not match what a layer or a network input expects. Also a
    ValueError, as a bad value is in Python (and as ONNX Runtime's users catch bad feeds)."""


class DataTypeError(FlowrtError, ValueError):
    """A tensor data type does not match what a layer or a network input expects. Also a
    ValueError, as ShapeError is."""


class InputError(FlowrtError, ValueError):
    """Feeds name an input the network does not have, or miss one it needs. Also a ValueError,
    which ONNX Runtime raises for a missing input."""


class BackendError(FlowrtError, RuntimeError):
    """A backend failed to register, load or build. Also a RuntimeError, which ONNX Runtime
    raises for a provider it cannot use."""


class RunError(FlowrtError, RuntimeError):
    """A workload failed while running; names the layer, its backend and the cause — and the
    pipeline stage, for a run through a ``flowrt.Pipeline`` (``layer`` and ``backend`` are
    None when the stage is a function, or failed before a layer ran). Also a RuntimeError,
    as a failure while running is in Python."""

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


class ArgumentError(FlowrtError, ValueError, TypeError):
    """An argument of the public API has the wrong type or is out of range; names the argument,
    what was expected and what was found. Also a ValueError and a TypeError, so that code
    written for Python's own argument errors still catches it (as numpy's AxisError)."""


if TYPE_CHECKING:
    import trio

    class StreamClosedError(FlowrtError, trio.ClosedResourceError): ...


def _stream_closed_error() -> type:
    import trio

    class StreamClosedError(FlowrtError, trio.ClosedResourceError):
        """A stream or pipeline stream was used after it closed, or closed while a task waited on
        it: a ``send``/``submit`` waiting for room when ``close()`` ran or its ``async with``
        ended, a request still running when the block ended. Also a ``trio.ClosedResourceError``,
        which trio's own channels raise in the same cases, so trio users' handlers still match."""

    StreamClosedError.__qualname__ = "StreamClosedError"
    return StreamClosedError


_stream_closed_lock = threading.Lock()


def __getattr__(name: str) -> Any:
    # StreamClosedError derives from trio's ClosedResourceError, and importing trio costs about
    # 0.1 s: the class is made when first asked for (the streams' modules ask as they are
    # imported), not with flowrt. Once, under a lock: it must be one class for every thread.
    if name != "StreamClosedError":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    with _stream_closed_lock:
        if name not in globals():
            globals()[name] = _stream_closed_error()
    return globals()[name]


__all__ = [
    "ArgumentError",
    "BackendError",
    "DataTypeError",
    "FlowrtError",
    "GraphError",
    "InputError",
    "ModelLoadError",
    "ResourceError",
    "RunError",
    "ShapeError",
    "StreamClosedError",
    "UnsupportedLayerError",
]
