"""ONNX Runtime's ``SessionOptions`` and its enums, with ONNX Runtime's field names and defaults.

What each field does in flowrt is in ``flowrt.ort_compat.session_config``; fields flowrt has no
concept for are kept (``get_session_options`` returns them) and logged as ignored.
"""

from __future__ import annotations

import enum
import os
from typing import Any, TypeVar

import attrs

from flowrt.errors import ArgumentError
from flowrt.validate import check_bool, check_instance, check_int

_WHERE = "SessionOptions"
E = TypeVar("E", bound=enum.IntEnum)


class GraphOptimizationLevel(enum.IntEnum):
    """How much of flowrt's graph passes a session runs (ONNX Runtime's levels and values)."""

    ORT_DISABLE_ALL = 0
    ORT_ENABLE_BASIC = 1
    ORT_ENABLE_EXTENDED = 2
    ORT_ENABLE_LAYOUT = 3
    ORT_ENABLE_ALL = 99


class ExecutionMode(enum.IntEnum):
    """Sequential, or independent branches at once (flowrt's ``parallel_branches``)."""

    ORT_SEQUENTIAL = 0
    ORT_PARALLEL = 1


class ExecutionOrder(enum.IntEnum):
    """ONNX Runtime's node order; accepted and ignored (flowrt orders by its dataflow)."""

    DEFAULT = 0
    PRIORITY_BASED = 1
    MEMORY_EFFICIENT = 2


def _enum(kind: type[E], value: Any) -> E:
    if isinstance(value, kind):
        return value
    if isinstance(value, int) and not isinstance(value, bool):
        try:
            return kind(value)
        except ValueError:
            pass
    members = ", ".join(f"{kind.__name__}.{m}" for m in kind.__members__)
    raise ArgumentError(f"{_WHERE}: expected one of {members}, got {value!r}")


# One named converter per field: attrs' mypy plugin reads only named functions as converters.
def _execution_mode(value: Any) -> ExecutionMode:
    return _enum(ExecutionMode, value)


def _execution_order(value: Any) -> ExecutionOrder:
    return _enum(ExecutionOrder, value)


def _optimization_level(value: Any) -> GraphOptimizationLevel:
    return _enum(GraphOptimizationLevel, value)


def _int(minimum: int, maximum: int | None = None):
    def validate(instance: Any, attribute: attrs.Attribute, value: Any) -> None:
        check_int(attribute.name, value, minimum=minimum, maximum=maximum, where=_WHERE)

    return validate


def _bool(instance: Any, attribute: attrs.Attribute, value: Any) -> None:
    check_bool(attribute.name, value, where=_WHERE)


def _str(instance: Any, attribute: attrs.Attribute, value: Any) -> None:
    check_instance(attribute.name, value, str, "a str", where=_WHERE)


def _path(value: Any) -> Any:
    return os.fspath(value) if isinstance(value, os.PathLike) else value


@attrs.define
class SessionOptions:
    """Options of an ``InferenceSession`` (ONNX Runtime's ``SessionOptions``): set fields, then
    pass it as the session's second argument. Every field is checked when set (ArgumentError).

    Mapped: ``intra_op_num_threads`` (CPU workers; 0 = one per core), ``execution_mode``
    (ORT_PARALLEL: independent branches at once), ``graph_optimization_level``
    (ORT_DISABLE_ALL turns flowrt's graph passes off), ``enable_profiling`` with
    ``profile_file_prefix`` (``end_profiling`` writes a Chrome trace), ``log_severity_level``
    (the ``flowrt`` logger's level, process-wide), ``optimized_model_filepath`` (the optimized
    network is saved there as a .flowrt file), ``add_free_dimension_override_by_name``.
    The others are accepted and ignored, with a logged note.
    """

    intra_op_num_threads: int = attrs.field(default=0, validator=_int(0))
    inter_op_num_threads: int = attrs.field(default=0, validator=_int(0))
    execution_mode: ExecutionMode = attrs.field(
        default=ExecutionMode.ORT_SEQUENTIAL, converter=_execution_mode
    )
    execution_order: ExecutionOrder = attrs.field(default=ExecutionOrder.DEFAULT, converter=_execution_order)
    graph_optimization_level: GraphOptimizationLevel = attrs.field(
        default=GraphOptimizationLevel.ORT_ENABLE_ALL, converter=_optimization_level
    )
    enable_profiling: bool = attrs.field(default=False, validator=_bool)
    profile_file_prefix: str = attrs.field(default="flowrt_profile_", converter=_path, validator=_str)
    log_severity_level: int = attrs.field(default=-1, validator=_int(-1, 4))
    log_verbosity_level: int = attrs.field(default=0, validator=_int(0))
    logid: str = attrs.field(default="", validator=_str)
    optimized_model_filepath: str = attrs.field(default="", converter=_path, validator=_str)
    enable_cpu_mem_arena: bool = attrs.field(default=True, validator=_bool)
    enable_mem_pattern: bool = attrs.field(default=True, validator=_bool)
    enable_mem_reuse: bool = attrs.field(default=True, validator=_bool)
    use_deterministic_compute: bool = attrs.field(default=False, validator=_bool)
    use_per_session_threads: bool = attrs.field(default=True, validator=_bool)
    config_entries: dict[str, str] = attrs.field(factory=dict, init=False)
    free_dimension_overrides: dict[str, int] = attrs.field(factory=dict, init=False)

    def add_session_config_entry(self, config_key: str, config_value: str) -> None:
        """Set a config entry (kept; flowrt reads none of ONNX Runtime's keys)."""
        check_instance("config_key", config_key, str, "a str", where=_WHERE)
        check_instance("config_value", config_value, str, "a str", where=_WHERE)
        self.config_entries[config_key] = config_value

    def get_session_config_entry(self, config_key: str) -> str:
        """A config entry's value; ArgumentError naming the key when it was never set."""
        if config_key not in self.config_entries:
            keys = ", ".join(map(repr, self.config_entries)) or "none"
            raise ArgumentError(
                f"{_WHERE} does not have configuration with key: {config_key!r} (it has {keys})"
            )
        return self.config_entries[config_key]

    def add_free_dimension_override_by_name(self, dim_name: str, dim_value: int) -> None:
        """Fix the symbolic input dimension ``dim_name`` (as the model names it) to ``dim_value``."""
        check_instance("dim_name", dim_name, str, "a str", where=_WHERE)
        self.free_dimension_overrides[dim_name] = check_int("dim_value", dim_value, where=_WHERE)
