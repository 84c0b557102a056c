"""Layer descriptors by layer kind name: ``flowrt.descriptors.Conv(pads=(1, 1, 1, 1))``.

Each layer kind's descriptor is a frozen attrs class whose fields are the ONNX attributes of
the operator of the same name, with ONNX's defaults.
"""

from __future__ import annotations

from flowrt.engine.graph.layer_kind import get_layer_kind, known_layer_kinds


def __getattr__(name: str) -> type:
    try:
        return get_layer_kind(name).descriptor
    except KeyError:
        raise AttributeError(f"flowrt.descriptors has no descriptor for layer kind {name!r}") from None


def __dir__() -> list[str]:
    return known_layer_kinds()
