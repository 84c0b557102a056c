"""Every layer kind flowrt knows, one small module per family.

Importing this package registers nothing: :func:`register_all` imports every module (each
registers its kinds), once, when ``flowrt.engine.graph.layer_kind`` is first asked for a
kind by name. The descriptors are some seventy attrs classes, whose making costs tens of
milliseconds: a module that needs one descriptor imports its family's module only.
"""

import importlib
import pkgutil


def register_all() -> None:
    """Import every layer kind module (idempotent: Python imports each one once)."""
    for module in pkgutil.iter_modules(__path__):
        importlib.import_module(f"{__name__}.{module.name}")
