"""What an ``InferenceSession``'s arguments come to: the backends, the optimizer options and
the runtime's arguments, from ONNX Runtime's (``sess_options``, ``providers``) and flowrt's
(``backends``, ``options``, ``cpu_workers``) alike."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import attrs

from flowrt.defaults import backend_ids
from flowrt.engine.graph.optimizer import OptimizerOptions
from flowrt.errors import ArgumentError
from flowrt.ort_compat import providers as provider_names
from flowrt.ort_compat.session_options import ExecutionMode, ExecutionOrder, SessionOptions
from flowrt.ort_compat.session_options import GraphOptimizationLevel as Level
from flowrt.ort_compat.severity import set_default_logger_severity
from flowrt.validate import check_instance

logger = logging.getLogger(__name__)

_WHERE = "InferenceSession"
# ONNX Runtime's keyword arguments of InferenceSession (its **kwargs), accepted and ignored.
ORT_KEYWORDS = ("enable_fallback", "read_config_from_model", "disabled_optimizers")
# The graph passes (OptimizerOptions flags) each level leaves off.
_PASSES = (
    "fold_constants",
    "fold_batch_norm",
    "fold_scale_shift",
    "fuse_activations",
    "fold_transposes",
    "collapse_reshapes",
    "pool_before_conv",
    "fold_qdq",
)
_OFF_AT_BASIC = ("fuse_activations", "pool_before_conv", "fold_qdq")
# Fields flowrt has no concept for: their ONNX Runtime default, and why they are ignored.
_IGNORED = {
    "inter_op_num_threads": (0, "flowrt's CPU workers serve both layers and branches (intra_op_num_threads)"),
    "execution_order": (ExecutionOrder.DEFAULT, "flowrt orders layers by its dataflow"),
    "log_verbosity_level": (0, "flowrt logs through Python's logging"),
    "logid": ("", "flowrt logs through Python's logging"),
    "enable_cpu_mem_arena": (True, "flowrt plans each model's memory once, at load"),
    "enable_mem_pattern": (True, "flowrt plans each model's memory once, at load"),
    "enable_mem_reuse": (True, "flowrt plans each model's memory once, at load"),
    "use_deterministic_compute": (False, "flowrt's kernels give the same result run after run"),
    "use_per_session_threads": (True, "each session has CPU workers of its own"),
}
_noted: set[str] = set()  # what has been logged as ignored, so it is logged once per process


@attrs.frozen
class SessionConfig:
    """A session's resolved arguments."""

    backends: tuple[str, ...]
    providers: tuple[str, ...]
    provider_options: dict[str, dict[str, str]]
    options: OptimizerOptions | None
    runtime: dict[str, Any]  # Runtime's keyword arguments
    sess_options: SessionOptions


def _note_once(key: str, message: str, *args: Any) -> None:
    if key not in _noted:
        _noted.add(key)
        logger.info(message, *args)


def split_positional(sess_options: Any, providers: Any, backends: Any, options: Any) -> tuple:
    """Arguments in flowrt's old positional order, ``(model, backends, options)``, moved to their
    keywords: a second argument that is a backend list, a third that is OptimizerOptions."""
    if isinstance(sess_options, str | Sequence) and not isinstance(sess_options, bytes):
        if backends is not None:
            raise ArgumentError(f"{_WHERE}: backends given twice, by position and by keyword")
        sess_options, backends = None, sess_options
    if isinstance(providers, OptimizerOptions):
        if options is not None:
            raise ArgumentError(f"{_WHERE}: options given twice, by position and by keyword")
        providers, options = None, providers
    return sess_options, providers, backends, options


def resolve(
    sess_options: Any,
    providers: Any,
    provider_options: Any,
    backends: Any,
    options: Any,
    cpu_workers: Any,
    kwargs: dict[str, Any],
) -> SessionConfig:
    """The session's configuration; ArgumentError for a bad or conflicting argument."""
    unknown = [k for k in kwargs if k not in ORT_KEYWORDS]
    if unknown:
        raise ArgumentError(f"{_WHERE}: unexpected keyword argument {unknown[0]!r}")
    for key in kwargs:
        _note_once(f"kwarg {key}", "InferenceSession: %s is accepted and ignored by flowrt", key)
    so = SessionOptions() if sess_options is None else sess_options
    check_instance("sess_options", so, SessionOptions, "a flowrt.SessionOptions or None", where=_WHERE)
    if options is not None:
        check_instance(
            "options", options, OptimizerOptions, "a flowrt.OptimizerOptions or None", where=_WHERE
        )
    if backends is not None and (providers is not None or provider_options is not None):
        raise ArgumentError(f"{_WHERE}: give providers= or backends=, not both")
    if backends is not None:
        chosen = tuple(backend_ids(backends, _WHERE))
        choice = provider_names.ProviderChoice(chosen, tuple(provider_names.providers_of(chosen)), {}, None)
    else:
        pairs = [] if providers is None else provider_names.normalize(providers, provider_options)
        choice = provider_names.choose(pairs)
    _note_ignored(so)
    if so.log_severity_level != -1:
        set_default_logger_severity(so.log_severity_level)
    return SessionConfig(
        backends=choice.backends,
        providers=choice.providers,
        provider_options=choice.options,
        options=optimizer_options(so, options),
        runtime=_runtime_arguments(so, cpu_workers, choice.opencl_device),
        sess_options=so,
    )


def optimizer_options(so: SessionOptions, options: OptimizerOptions | None) -> OptimizerOptions | None:
    """``options`` (or the defaults) with the passes ``graph_optimization_level`` leaves off:
    all of them at ORT_DISABLE_ALL, activation fusion and pool moves at ORT_ENABLE_BASIC."""
    level = so.graph_optimization_level
    if level >= Level.ORT_ENABLE_EXTENDED:
        return options
    off = _PASSES if level == Level.ORT_DISABLE_ALL else _OFF_AT_BASIC
    _note_once(
        f"level {level.name}",
        "graph_optimization_level=%s: flowrt's graph passes %s are off; backends' own "
        "substitutions (optimize_subgraph) still run",
        level.name,
        ", ".join(off),
    )
    return attrs.evolve(options or OptimizerOptions(), **dict.fromkeys(off, False))


def _runtime_arguments(so: SessionOptions, cpu_workers: Any, opencl_device: str | None) -> dict[str, Any]:
    if cpu_workers is None and so.intra_op_num_threads > 0:
        cpu_workers = so.intra_op_num_threads
    elif cpu_workers is not None and so.intra_op_num_threads > 0:
        logger.info("InferenceSession: cpu_workers=%r wins over intra_op_num_threads", cpu_workers)
    arguments: dict[str, Any] = {
        "cpu_workers": cpu_workers,
        "profiling": so.enable_profiling,
        "parallel_branches": so.execution_mode == ExecutionMode.ORT_PARALLEL,
    }
    if opencl_device is not None:
        arguments["opencl_device"] = opencl_device
    return arguments


def _note_ignored(so: SessionOptions) -> None:
    for name, (default, reason) in _IGNORED.items():
        value = getattr(so, name)
        if value != default:
            _note_once(name, "SessionOptions.%s=%r is accepted and ignored: %s", name, value, reason)
    for key in so.config_entries:
        _note_once(f"config {key}", "session config entry %r is accepted and ignored by flowrt", key)
