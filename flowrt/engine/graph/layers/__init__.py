"""Every layer kind flowrt knows, one small module per family; importing this registers them all."""

import importlib
import pkgutil

for _module in pkgutil.iter_modules(__path__):
    importlib.import_module(f"{__name__}.{_module.name}")
