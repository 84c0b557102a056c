"""The model a command works on: an .onnx file optimized for a backend list, or a .flowrt file
as it was converted, with the backend list checked first.

The default list is the fastest this machine has (``flowrt.defaults``, as for
``flowrt.optimize`` and ``InferenceSession``): CpuAcc then CpuRef, with GpuAcc first
where OpenCL shows a GPU. GpuAcc runs on a CPU OpenCL device (PoCL) only when that device is
named (``FLOWRT_OPENCL_DEVICE``): a CPU device runs most models slower than CpuAcc. Asking for
GpuAcc where it cannot run is an error here, not a silent fallback to the next backend.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from typing import Any

import attrs
import numpy as np

import flowrt
from flowrt import defaults, serialize
from flowrt.engine.scheduler.feeds import check_feeds
from flowrt.errors import BackendError, FlowrtError, InputError
from flowrt.models import pattern_input
from flowrt.registry import BackendRegistry
from flowrt.registry.dynamic import load_dynamic_backends
from flowrt.types import TensorInfo

GPU = defaults.GPU_BACKEND
# The command line's optimizer switches: flag -> the OptimizerOptions field it turns on.
OPTIMIZER_FLAGS = {"--fast-math": "fast_math", "--fp16": "reduce_fp32_to_fp16"}


def optimizer_flags(args: Any) -> tuple[str, ...]:
    """The OptimizerOptions fields the parsed command line turned on (:data:`OPTIMIZER_FLAGS`)."""
    return tuple(field for field in OPTIMIZER_FLAGS.values() if getattr(args, field, False))


def registry() -> BackendRegistry:
    """The process's backends and the dynamic ones a Runtime would load (FLOWRT_BACKEND_PATHS and
    the ``flowrt.backends`` entry points), for commands that optimize before any runtime exists."""
    found = flowrt.backend_registry().copy()
    load_dynamic_backends(found)
    return found


def check_gpu(backends: list[str], origin: str) -> None:
    """BackendError when ``backends`` has GpuAcc and it cannot run here, or would run on a CPU
    OpenCL device nobody named. ``origin`` says where the list came from ("--backends names");
    the rest is the message every entry point gives (``device.gpu_needed_message``)."""
    if GPU not in backends:
        return
    from flowrt.workers.gpu import device

    spec = os.environ.get(device.DEVICE_ENV)
    if spec and not device.unavailable_reason():
        device.choose_device(spec)  # BackendError listing the devices when it names none
        return
    if device.unavailable_reason() or not defaults.gpu_device_present():
        raise BackendError(f"{origin} GpuAcc: {device.gpu_needed_message('GpuAcc', option=None)}")


def parse_backends(text: str, known: BackendRegistry) -> list[str]:
    """A ``--backends`` value as a list of registered backend ids; InputError otherwise."""
    names = list(dict.fromkeys(b.strip() for b in text.split(",") if b.strip()))
    if not names:
        raise InputError(f"--backends expects a comma-separated list of backends, got {text!r}")
    unknown = [b for b in names if not known.is_registered(b)]
    if unknown:
        raise InputError(
            f"--backends names {unknown[0]!r}, which is not a registered backend; "
            f"registered: {', '.join(str(b) for b in known.ids())}"
        )
    return names


def open_model(
    path: str,
    backends: str | None,
    *,
    default: list[str] | None = None,
    options: flowrt.OptimizerOptions | None = None,
    flags: Iterable[str] = (),
) -> flowrt.OptimizedNetwork:
    """A .flowrt file as it was converted (``--backends`` and the optimizer's ``flags`` only an
    error when given and different), or an ONNX model optimized for ``backends`` (default:
    ``default``, else ``flowrt.defaults.default_backends()``) with ``options`` and the options
    ``flags`` names (:data:`OPTIMIZER_FLAGS`'s values) turned on."""
    known = registry()
    chosen = None if backends is None else parse_backends(backends, known)
    if chosen is not None:
        check_gpu(chosen, "--backends names")
    flags = tuple(flags)
    if serialize.is_flowrt_file(path):
        opt = serialize.load(path, registry=known)
        if chosen is not None and chosen != opt.backends:
            raise InputError(
                f"--backends {backends} differs from the backends {path} was converted for "
                f"({','.join(opt.backends)}); leave --backends out, or convert the model again to change them"
            )
        for flag, field in OPTIMIZER_FLAGS.items():
            if field in flags and not getattr(opt.options, field):
                raise InputError(
                    f"{flag}: {path} was converted without {field}; leave {flag} out, "
                    f"or convert the model again with {flag}"
                )
        check_gpu(opt.backends, f"{path} was converted for")
        return opt
    if chosen is None:
        chosen = default or defaults.default_backends()
        check_gpu(chosen, f"the default backends ({','.join(chosen)}) include")
    if flags:
        options = attrs.evolve(options or flowrt.OptimizerOptions(), **dict.fromkeys(flags, True))
    return flowrt.optimize(flowrt.onnx.load(path), backends=chosen, options=options, registry=known)


def input_infos(opt: flowrt.OptimizedNetwork) -> dict[str, TensorInfo]:
    """The network's inputs as ``{name: TensorInfo}``, in order."""
    return {layer.descriptor.name: layer.descriptor.info for layer in opt.graph.input_layers}


def check_inputs(opt: flowrt.OptimizedNetwork, given: Mapping[str, np.ndarray]) -> None:
    """Raise, naming the ``--input``, when a given array's name, dtype or shape does not fit
    the model: checked before the model is loaded (a load can compile for minutes)."""
    infos = input_infos(opt)
    unknown = sorted(set(given) - set(infos))
    if unknown:
        raise InputError(
            f"--input names {unknown[0]!r}, which the model does not have; its inputs: {', '.join(infos)}"
        )
    for name, array in given.items():
        try:
            check_feeds({name: infos[name]}, {name: array})
        except FlowrtError as e:
            raise type(e)(f"--input {name}: {e}") from None


def feeds_for(infos: Mapping[str, TensorInfo], given: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The given arrays, and the deterministic pattern for every input not given."""
    return {name: given[name] if name in given else pattern_input(info) for name, info in infos.items()}
