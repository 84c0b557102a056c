"""ONNX Runtime's Python API on flowrt, so that ``import flowrt as ort`` runs ONNX Runtime code.

The session itself is ``flowrt.InferenceSession`` (``flowrt/session.py``); here are the rest:
providers and the module-level functions, ``SessionOptions`` and its enums, ``RunOptions``,
``OrtValue``, ``IOBinding``, ``ModelMetadata`` and ONNX Runtime's exception names
(``flowrt.ort_compat.exceptions``). The README's "Coming from ONNX Runtime" tells what maps
to what, and what is accepted and ignored.
"""

from flowrt.ort_compat.io_binding import IOBinding
from flowrt.ort_compat.metadata import ModelMetadata
from flowrt.ort_compat.ortvalue import OrtValue
from flowrt.ort_compat.providers import get_all_providers, get_available_providers, get_device
from flowrt.ort_compat.run_options import RunOptions, RunTerminatedError
from flowrt.ort_compat.session_options import (
    ExecutionMode,
    ExecutionOrder,
    GraphOptimizationLevel,
    SessionOptions,
)
from flowrt.ort_compat.severity import set_default_logger_severity


def get_version_string() -> str:
    """flowrt's version (ONNX Runtime's function of that name gives its own)."""
    from flowrt import __version__

    return __version__


__all__ = [
    "ExecutionMode",
    "ExecutionOrder",
    "GraphOptimizationLevel",
    "IOBinding",
    "ModelMetadata",
    "OrtValue",
    "RunOptions",
    "RunTerminatedError",
    "SessionOptions",
    "get_all_providers",
    "get_available_providers",
    "get_device",
    "get_version_string",
    "set_default_logger_severity",
]
