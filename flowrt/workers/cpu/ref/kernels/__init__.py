"""CpuRef kernels: plain, readable numpy, one small module per family.

A kernel is registered per layer kind with :func:`ref_kernel`. It is called as
``kernel(descriptor, *inputs)`` with one numpy array per input slot (None for an absent
optional input) and returns an array or a tuple of arrays, one per output.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from flowrt.registry.kernel_modules import import_kernel_modules

RefKernel = Callable[..., Any]

REF_KERNELS: dict[str, RefKernel] = {}


def ref_kernel(*names: str) -> Callable[[RefKernel], RefKernel]:
    """Register the decorated function as the CpuRef kernel of each named layer kind."""

    def register(fn: RefKernel) -> RefKernel:
        for name in names:
            if name in REF_KERNELS:
                raise ValueError(f"CpuRef kernel for {name!r} registered twice")
            REF_KERNELS[name] = fn
        return fn

    return register


def load_all() -> dict[str, RefKernel]:
    """Import every kernel module (registering its kernels), once, and return the table."""
    import_kernel_modules(__name__)
    return REF_KERNELS
