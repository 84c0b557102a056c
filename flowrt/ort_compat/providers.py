"""ONNX Runtime's execution providers as flowrt backend lists.

``CPUExecutionProvider`` is CpuAcc then CpuRef (a layer CpuAcc lacks falls back to the
reference); ``OpenCLExecutionProvider`` is GpuAcc before them. A registered flowrt backend id
("CpuRef") may be named as a provider too. Other ONNX Runtime providers (CUDA, TensorRT, ...)
are not available here: as ONNX Runtime does for a provider it was not built with, they are
skipped with a warning, and a list left empty once they are skipped runs on the CPU. A name
neither knows is an error. With no providers at all (None or ``[]``), a session runs on flowrt's
default list (``flowrt.defaults``): CpuAcc, CpuRef, with GpuAcc first only where OpenCL
shows a GPU (a CPU OpenCL device such as PoCL's does not count).
"""

from __future__ import annotations

import logging
import os
import warnings
from collections.abc import Mapping, Sequence
from typing import Any

import attrs

from flowrt import defaults
from flowrt.errors import BackendError
from flowrt.registry import backend_registry
from flowrt.validate import argument_error

logger = logging.getLogger(__name__)

CPU = "CPUExecutionProvider"
OPENCL = "OpenCLExecutionProvider"
BACKENDS: dict[str, tuple[str, ...]] = {
    CPU: defaults.CPU_BACKENDS,
    OPENCL: (defaults.GPU_BACKEND, *defaults.CPU_BACKENDS),
}
# The provider option that names GpuAcc's OpenCL device (Runtime(opencl_device=...)).
DEVICE_OPTION = "device"

# ONNX Runtime's provider names (its get_all_providers()), highest precedence first.
ORT_PROVIDERS = (
    "TensorrtExecutionProvider",
    "CUDAExecutionProvider",
    "MIGraphXExecutionProvider",
    "OpenVINOExecutionProvider",
    "DnnlExecutionProvider",
    "VitisAIExecutionProvider",
    "QNNExecutionProvider",
    "NnapiExecutionProvider",
    "VSINPUExecutionProvider",
    "JsExecutionProvider",
    "CoreMLExecutionProvider",
    "DmlExecutionProvider",
    "RknpuExecutionProvider",
    "WebNNExecutionProvider",
    "WebGpuExecutionProvider",
    "XnnpackExecutionProvider",
    "CANNExecutionProvider",
    "AzureExecutionProvider",
    CPU,
)


def get_all_providers() -> list[str]:
    """Every provider name a session takes: ONNX Runtime's, and flowrt's OpenCLExecutionProvider."""
    return [*ORT_PROVIDERS[:-1], OPENCL, CPU]


def get_available_providers() -> list[str]:
    """The providers that can run here: OpenCLExecutionProvider where OpenCL shows a GPU, and
    CPUExecutionProvider. Probes OpenCL (imports pyopencl) on first call."""
    return [OPENCL, CPU] if defaults.gpu_device_present() else [CPU]


def get_device() -> str:
    """ "GPU" where OpenCL shows a GPU device, else "CPU" (ONNX Runtime's ``get_device``)."""
    return "GPU" if defaults.gpu_device_present() else "CPU"


def normalize(providers: Any, provider_options: Any) -> list[tuple[str, dict[str, str]]]:
    """``(name, options)`` pairs from ``providers`` (names or ``(name, dict)`` tuples) and
    ``provider_options`` (dicts, one per name), checked as ONNX Runtime checks them; repeats
    are dropped with a warning. ArgumentError (a ValueError) where ONNX Runtime raises ValueError."""
    where = "InferenceSession"
    if isinstance(providers, str) or not isinstance(providers, Sequence):
        raise argument_error(
            "providers", 'a sequence of provider names (["CPUExecutionProvider"])', providers, where
        )
    if provider_options is not None:
        if not isinstance(provider_options, Sequence) or len(provider_options) != len(providers):
            raise argument_error(
                "provider_options", "a sequence of dicts, one per provider", provider_options, where
            )
        if not all(isinstance(p, str) for p in providers):
            raise argument_error("providers", "names only when provider_options is given", providers, where)
        pairs = list(zip(providers, provider_options))
    else:
        pairs = [(p, {}) if isinstance(p, str) else p for p in providers]
    normalized: dict[str, dict[str, str]] = {}
    for pair in pairs:
        if not (isinstance(pair, tuple) and len(pair) == 2 and isinstance(pair[0], str)):
            raise argument_error("providers", "names or (name, options dict) tuples", providers, where)
        name, options = pair
        if not isinstance(options, Mapping):
            raise argument_error(f"the options of provider {name!r}", "a dict", options, where)
        if name in normalized:
            warnings.warn(f"Duplicate provider '{name}' encountered, ignoring.", stacklevel=4)
            continue
        normalized[name] = {str(k): str(v) for k, v in options.items()}
    return list(normalized.items())


@attrs.frozen
class ProviderChoice:
    """What a session's providers come to: backends in preference order, the providers as
    ``get_providers`` reports them with their options, and GpuAcc's OpenCL device spec."""

    backends: tuple[str, ...]
    providers: tuple[str, ...]
    options: dict[str, dict[str, str]]
    opencl_device: str | None = None


def default_choice() -> ProviderChoice:
    """What a session given no providers runs on: flowrt's default list (``flowrt.defaults``),
    GpuAcc first only where OpenCL shows a GPU, reported as the providers of its backends."""
    backends = defaults.default_backends()
    providers = providers_of(backends)
    return ProviderChoice(tuple(backends), tuple(providers), {name: {} for name in providers})


def choose(pairs: list[tuple[str, dict[str, str]]]) -> ProviderChoice:
    """The backends for ``pairs`` (see the module doc); no pairs at all means the default list
    (:func:`default_choice`), and pairs all skipped mean CPUExecutionProvider."""
    if not pairs:
        return default_choice()
    backends: list[str] = []
    used: dict[str, dict[str, str]] = {}
    opencl_device = None
    for name, options in pairs:
        if name in BACKENDS:
            if name == OPENCL:
                opencl_device = _opencl_device(options)
            backends += BACKENDS[name]
        elif backend_registry().is_registered(name):
            backends.append(name)
        elif name in ORT_PROVIDERS:
            warnings.warn(
                f"Specified provider '{name}' is not in available provider names."
                f"Available providers: '{', '.join(get_available_providers())}'",
                stacklevel=4,
            )
            continue
        else:
            raise argument_error(
                "providers",
                f"names of available providers ({', '.join(get_available_providers())}) or flowrt "
                f"backend ids ({', '.join(str(b) for b in backend_registry().ids())})",
                name,
                "InferenceSession",
            )
        _log_ignored_options(name, options)
        used[name] = options
    if not backends:
        logger.info("no provider of %s is available; running on %s", [n for n, _ in pairs], CPU)
        backends, used = list(BACKENDS[CPU]), {CPU: {}}
    return ProviderChoice(tuple(dict.fromkeys(backends)), tuple(used), used, opencl_device)


def _opencl_device(options: Mapping[str, str]) -> str | None:
    """The device spec OpenCLExecutionProvider runs on; BackendError where none is named and
    OpenCL shows no GPU: a CPU OpenCL device (PoCL) runs only when named."""
    spec = options.get(DEVICE_OPTION) or os.environ.get("FLOWRT_OPENCL_DEVICE") or None
    if spec is None and not defaults.gpu_device_present():
        from flowrt.workers.gpu.device import gpu_needed_message

        option = "providers=[('OpenCLExecutionProvider', {'device': '{device}'})]"
        raise BackendError(gpu_needed_message(OPENCL, option))
    return spec


def _log_ignored_options(name: str, options: Mapping[str, str]) -> None:
    ignored = [k for k in options if not (name == OPENCL and k == DEVICE_OPTION)]
    if ignored:
        logger.info("provider options %s of %s are accepted and ignored by flowrt", ignored, name)


def providers_of(backends: Sequence[str]) -> list[str]:
    """The provider names ``get_providers`` reports for a backend list (GpuAcc: OpenCL, the
    CPU backends: CPUExecutionProvider, any other: its id)."""
    names = [OPENCL if b == "GpuAcc" else CPU if b in ("CpuAcc", "CpuRef") else b for b in backends]
    return list(dict.fromkeys(names))
