"""Kernel packages register their kernels by being imported: one module per kernel family."""

from __future__ import annotations

import functools
import importlib
import pkgutil


@functools.cache
def import_kernel_modules(package: str) -> None:
    """Import every module of ``package`` (each registers its kernels), once per process:
    layer support asks for a backend's kernel table per layer, and listing a package's
    directory costs milliseconds each time."""
    for module in pkgutil.iter_modules(importlib.import_module(package).__path__):
        importlib.import_module(f"{package}.{module.name}")
