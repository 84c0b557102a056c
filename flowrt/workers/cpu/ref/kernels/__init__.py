"""CpuRef kernels: plain, readable numpy, one small module per family.

A kernel is registered per layer kind with :func:`ref_kernel`. It is called as
``kernel(descriptor, *inputs)`` with one numpy array per input slot (None for an absent
optional input) and returns an array or a tuple of arrays, one per output.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable
from typing import Any

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


_all_loaded = False


def load_all() -> dict[str, RefKernel]:
    """Import every kernel module (registering its kernels) and return the table.

    The modules are listed and imported once: layer support asks for the table per layer,
    and listing a package's directory costs a few hundred microseconds each time.
    """
    global _all_loaded
    if not _all_loaded:
        for module in pkgutil.iter_modules(__path__):
            importlib.import_module(f"{__name__}.{module.name}")
        _all_loaded = True
    return REF_KERNELS
