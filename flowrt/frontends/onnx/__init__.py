"""The ONNX front end: ``load(path)`` -> Network.

The importer, and the ``onnx`` package it parses with (tens of milliseconds to import), are
imported on the first call, not with flowrt.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from flowrt.engine.graph.network import Network


def load(
    source: str | os.PathLike | bytes | Any, *, check: bool = True, memory_budget: int | None = None
) -> Network:
    """Import an ONNX model (a path, bytes or an ``onnx.ModelProto``) as a Network.

    Raises ModelLoadError for a model file that is missing, empty, not an ONNX model or fails
    onnx's checker (``check``), UnsupportedLayerError for an op flowrt does not know, and
    ResourceError when the constants would pass ``memory_budget`` (bytes): see
    :func:`flowrt.frontends.onnx.importer.load`.
    """
    from flowrt.frontends.onnx.importer import load as load_model

    return load_model(source, check=check, memory_budget=memory_budget)


def read_model(source: str | os.PathLike | bytes | Any) -> tuple[Any, str]:
    """Parse a model from a path, bytes or a ModelProto; returns the ``onnx.ModelProto`` and a
    name for messages (see :func:`flowrt.frontends.onnx.importer.read_model`)."""
    from flowrt.frontends.onnx.importer import read_model as read

    return read(source)


__all__ = ["load", "read_model"]
