"""``flowrt backends``: the registered backends, the dynamic ones found, and the OpenCL devices;
with ``--ops``, the layer kinds each built-in backend runs (``flowrt.cli.operators``)."""

from __future__ import annotations

import argparse

import flowrt
from flowrt.registry.dynamic import format_report, load_dynamic_backends
from flowrt.workers.cpu import threading_layer
from flowrt.workers.cpu.acc import team
from flowrt.workers.cpu.workers import default_cpu_workers


def _print_opencl_devices() -> None:
    """GpuAcc's candidate devices: what FLOWRT_OPENCL_DEVICE / Runtime(opencl_device=...) take."""
    from flowrt.workers.gpu import device

    found = device.describe_devices()
    if not found:
        print(f"OpenCL devices: none ({device.unavailable_reason()})")
        return
    print(f"OpenCL devices (GpuAcc takes the one marked *; pick with {device.DEVICE_ENV}=platform:device):")
    for d in found:
        hints = "yes" if d.priority_hints else "no"
        broken = f"  cannot build kernels: {d.build_failure}" if d.build_failure else ""
        print(
            f" {'*' if d.chosen else ' '} {d.index}  {d.name}  [{d.type}]  {d.platform}, driver "
            f"{d.driver_version}  memory {d.global_memory_bytes / 2**30:.1f} GiB  queue priority hints: {hints}"
            f"  tensor cores: {'yes' if d.tensor_cores else 'no'}{broken}"
        )


def _capability(value: object) -> str:
    """A capability's value as printed: a set (``fused_activation``) sorted, so that the output
    is the same run after run (a set of strings iterates in a per-process hash order)."""
    if isinstance(value, set | frozenset):
        return "{" + ", ".join(sorted(map(str, value))) + "}"
    return str(value)


def command(args: argparse.Namespace) -> int:
    """``flowrt backends``: see the module docstring."""
    if getattr(args, "ops", False):
        from flowrt.cli.operators import render

        print(render(), end="")
        return 0
    registry = flowrt.backend_registry().copy()
    dynamic = load_dynamic_backends(registry)
    for bid in registry.ids():
        backend = registry.get(bid)
        major, minor = backend.version
        caps = ", ".join(f"{k}={_capability(v)}" for k, v in backend.capabilities.items())
        print(f"{bid}  version {major}.{minor}  capabilities: {caps}")
    print(f"CpuAcc's parallel regions: numba's {threading_layer.requested()!r} threading layer")
    print(f"CpuAcc's team: {team.describe(default_cpu_workers())}")
    if dynamic.found or dynamic.skipped:
        print("dynamic backends:")
        print("\n".join(f"  {line}" for line in format_report(dynamic).splitlines()))
    _print_opencl_devices()
    return 0
