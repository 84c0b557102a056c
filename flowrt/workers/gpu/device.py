"""Which OpenCL device GpuAcc runs on, and what the machine offers.

The choice, in order: an explicit ``spec`` (``Runtime(opencl_device=...)``), else the
``FLOWRT_OPENCL_DEVICE`` environment variable, else the first GPU. A device that is not a GPU
(PoCL's CPU device) is taken only when named: it runs most models slower than CpuAcc, so
GpuAcc on it unasked would be a slow path nobody chose. A spec is a ``"platform:device"``
index pair (``"0:1"``) or a case-insensitive substring of the device or platform name
(``"H100"``, ``"pthread"``).

pyopencl is imported here and only here: every GpuAcc module takes ``cl`` from this module, so
a missing or broken OpenCL install leaves ``cl`` as None and GpuAcc reports itself unavailable
(:func:`unavailable_reason`) instead of breaking ``import flowrt``.
"""

from __future__ import annotations

import functools
import logging
import os
from typing import Any

import attrs

from flowrt.errors import BackendError

logger = logging.getLogger(__name__)

try:
    import pyopencl as cl
except Exception as _e:  # ImportError, or an ICD loader that fails while loading
    cl: Any = None  # type: ignore[no-redef]  # None: pyopencl is unusable
    _IMPORT_ERROR = f"pyopencl failed to import ({type(_e).__name__}: {_e})"
else:
    _IMPORT_ERROR = ""

DEVICE_ENV = "FLOWRT_OPENCL_DEVICE"

# cl_khr_priority_hints: not in pyopencl's enums, so the raw values from cl_ext.h.
CL_QUEUE_PRIORITY_KHR = 0x1096
CL_QUEUE_PRIORITY_HIGH_KHR = 1 << 0
CL_QUEUE_PRIORITY_MED_KHR = 1 << 1
CL_QUEUE_PRIORITY_LOW_KHR = 1 << 2


def platforms() -> list[Any]:
    """The OpenCL platforms of this machine; empty when there are none (or no OpenCL at all)."""
    if cl is None:
        return []
    try:
        return list(cl.get_platforms())
    except cl.Error as e:
        # An ICD loader with no vendor file answers PLATFORM_NOT_FOUND_KHR.
        logger.info("no OpenCL platform: %s", e)
        return []


@functools.cache
def gpu_device_present() -> bool:
    """Whether OpenCL shows a GPU device (a CPU device, such as PoCL's, does not count): what
    makes GpuAcc a default backend. Probed once per process; ``cache_clear()`` asks again."""
    if cl is None:
        return False
    for platform in platforms():
        try:
            if platform.get_devices(device_type=cl.device_type.GPU):
                return True
        except cl.Error:  # DEVICE_NOT_FOUND: this platform has no GPU
            continue
    return False


def _devices() -> list[tuple[int, int, Any]]:
    """Every device as (platform index, device index, device)."""
    found: list[tuple[int, int, Any]] = []
    for p, platform in enumerate(platforms()):
        try:
            devices = platform.get_devices()
        except cl.Error:
            continue  # a platform with no device of any type
        found.extend((p, d, device) for d, device in enumerate(devices))
    return found


# A kernel every OpenCL C compiler builds: what build_failure asks a device's compiler to do.
_PROBE_SOURCE = "__kernel void probe(__global float *x) { x[get_global_id(0)] *= 2.0f; }"
_build_failures: dict[int, str] = {}
# The context each successful probe made, by device, for the device's DeviceContext to take: a
# context costs 1-2 s on NVIDIA's driver (an H200's CUDA context), paid once rather than twice.
_probe_contexts: dict[int, Any] = {}


def build_failure(device: Any) -> str:
    """Why ``device``'s OpenCL C compiler cannot build a trivial kernel, or "" when it can.

    A device can be listed and still compile nothing: PoCL 3.0's LLVM 14 does not know CPUs
    newer than it (AMD Zen 5 reads as 'generic', which its clang refuses), so every build
    fails. Such a device cannot run GpuAcc. Asked once per device and process."""
    key = device.int_ptr
    if key not in _build_failures:
        try:
            context = cl.Context([device])
            cl.Program(context, _PROBE_SOURCE).build()
        except (cl.Error, RuntimeError) as e:
            text = str(e)
            errors = [line.strip() for line in text.splitlines() if "error" in line.lower()]
            detail = next((line for line in errors if line.startswith("error")), None)
            _build_failures[key] = detail or text.splitlines()[0]
        else:
            _build_failures[key] = ""
            _probe_contexts[key] = context
    return _build_failures[key]


def new_context(device: Any) -> Any:
    """An OpenCL context on ``device``: the one its :func:`build_failure` probe made, the
    first time it is asked for, else a new one."""
    found = _probe_contexts.pop(device.int_ptr, None)
    return found if found is not None else cl.Context([device])


def unavailable_reason() -> str:
    """Why GpuAcc cannot run here, or "" when it can: no pyopencl, no device, or no device
    whose compiler builds kernels."""
    if cl is None:
        return _IMPORT_ERROR
    devices = _devices()
    if not devices:
        return "no OpenCL platform or device found"
    failures = [(p, d, device, build_failure(device)) for p, d, device in devices]
    if all(failure for *_, failure in failures):
        listed = "; ".join(
            f"{p}:{d} {device.name.strip()!r}: {failure}" for p, d, device, failure in failures
        )
        return f"no OpenCL device here can build kernels ({listed})"
    return ""


def gpu_needed_message(asked: str, option: str | None = "Runtime(opencl_device='{device}')") -> str:
    """The error for ``asked`` ("GpuAcc", "OpenCLExecutionProvider"), wanted with no device
    named where OpenCL shows no GPU: what the machine has instead and what to do. ``option`` is
    how the caller names a device besides FLOWRT_OPENCL_DEVICE, with ``{device}`` for the first
    one's index (None: the variable alone). One builder, so every entry point says the same."""
    reason = unavailable_reason()
    if reason:
        return (
            f"{asked} needs an OpenCL GPU device, and this machine has no OpenCL device ({reason}); "
            "install an OpenCL driver (docs/gpu-setup.md), or leave GpuAcc out: the default "
            "backends, CpuAcc and CpuRef, need none"
        )
    devices = _descriptions(None)
    kind = "CPU" if all("CPU" in d.type for d in devices) else "non-GPU"
    found = ", ".join(f"{d.index} {d.name!r} ({d.platform})" for d in devices)
    first = devices[0].index
    some, runs, it = (
        (f"a {kind} OpenCL device", "runs", "it")
        if len(devices) == 1
        else (f"{kind} OpenCL devices", "run", "one")
    )
    also = "" if option is None else f" or {option.replace('{device}', first)}"
    return (
        f"{asked} needs an OpenCL GPU device, and this machine has only {some}: {found}, which "
        f"{runs} most models slower than CpuAcc; to use {it} anyway, name it: {DEVICE_ENV}={first}{also}"
    )


def choose_device(spec: str | None = None) -> Any:
    """The ``cl.Device`` named by ``spec`` (see the module docstring); BackendError when none
    matches, when none is named and OpenCL shows no GPU (saying what it shows), and when the
    device's compiler builds no kernel (:func:`build_failure`)."""
    device = _named_device(spec)
    failure = build_failure(device)
    if failure:
        raise BackendError(
            f"OpenCL device {device.name.strip()!r} ({device.platform.name.strip()}) cannot build "
            f"kernels: {failure}; GpuAcc cannot run on it"
        )
    return device


def _named_device(spec: str | None) -> Any:
    """The device ``spec`` names (choose_device's choice, before its compiler is asked)."""
    spec = spec if spec is not None else os.environ.get(DEVICE_ENV) or None
    devices = _devices()
    if not devices or spec is None:
        gpus = [d for _, _, d in devices if d.type & cl.device_type.GPU]
        if not gpus:
            raise BackendError(gpu_needed_message("GpuAcc"))
        return gpus[0]
    pair = spec.split(":")
    if len(pair) == 2 and all(part.strip().isdigit() for part in pair):
        wanted = (int(pair[0]), int(pair[1]))
        for p, d, device in devices:
            if (p, d) == wanted:
                return device
    else:
        needle = spec.lower()
        for _, _, device in devices:
            if needle in device.name.lower() or needle in device.platform.name.lower():
                return device
    known = ", ".join(f"{p}:{d} {device.name!r}" for p, d, device in devices)
    raise BackendError(
        f"OpenCL device {spec!r} not found (from {DEVICE_ENV} or opencl_device); devices: {known}"
    )


def priority_properties(level: int) -> list[int]:
    """The queue property list asking for priority ``level`` (one of ``CL_QUEUE_PRIORITY_*_KHR``)."""
    return [CL_QUEUE_PRIORITY_KHR, level]


def takes_priority_hints(device: Any, context: Any = None) -> bool:
    """Whether a queue with ``CL_QUEUE_PRIORITY_KHR`` can be made on ``device``.

    Probed by making one: the extension string is not enough (drivers differ in what they
    accept), and a refusal is a clean error. NVIDIA's driver takes it; PoCL refuses it.
    """
    context = context or cl.Context([device])
    try:
        cl.CommandQueue(context, device, properties=priority_properties(CL_QUEUE_PRIORITY_HIGH_KHR))  # type: ignore[arg-type]  # pyopencl's stubs lack property lists
    except (cl.Error, RuntimeError, TypeError):
        return False
    return True


def has_tensor_cores(device: Any) -> bool:
    """Whether GpuAcc multiplies half operands on ``device``'s tensor cores: an NVIDIA GPU of
    compute capability 8.0 or later (Ampere, Hopper), whose OpenCL compiler takes PTX's
    ``mma.sync`` inline (gemm.cl's TENSOR_CORES build). Read from the NVIDIA attribute query."""
    if not (device.type & cl.device_type.GPU) or "cl_nv_device_attribute_query" not in device.extensions:
        return False
    try:
        return int(device.compute_capability_major_nv) >= 8
    except (cl.Error, AttributeError):
        return False


@attrs.frozen
class DeviceDescription:
    """One OpenCL device as ``flowrt backends`` shows it."""

    index: str  # "platform:device", what FLOWRT_OPENCL_DEVICE takes
    name: str
    platform: str
    type: str
    driver_version: str
    global_memory_bytes: int
    priority_hints: bool
    tensor_cores: bool = False  # half GEMMs on the tensor cores (has_tensor_cores)
    build_failure: str = ""  # why its compiler builds no kernel; "" when it does
    chosen: bool = False  # the one GpuAcc takes with no opencl_device given (if any)


def describe_devices() -> list[DeviceDescription]:
    """Every OpenCL device of the machine, with whether it takes queue priority hints."""
    try:
        chosen = choose_device().int_ptr
    except BackendError:  # none, or FLOWRT_OPENCL_DEVICE names none
        chosen = None
    return _descriptions(chosen)


def _descriptions(chosen: int | None) -> list[DeviceDescription]:
    """Every device's description; ``chosen``: the pointer of the one GpuAcc takes."""
    failures = {device.int_ptr: build_failure(device) for _, _, device in _devices()}  # probed first
    return [
        DeviceDescription(
            index=f"{p}:{d}",
            name=device.name.strip(),
            platform=device.platform.name.strip(),
            type=cl.device_type.to_string(device.type),  # type: ignore[operator]  # pyopencl's stubs: not callable
            driver_version=device.driver_version,
            global_memory_bytes=int(device.global_mem_size),
            # on the probe's context where it made one (a context costs seconds on some drivers)
            priority_hints=takes_priority_hints(device, _probe_contexts.get(device.int_ptr)),
            tensor_cores=has_tensor_cores(device),
            build_failure=failures[device.int_ptr],
            chosen=device.int_ptr == chosen,
        )
        for p, d, device in _devices()
    ]
