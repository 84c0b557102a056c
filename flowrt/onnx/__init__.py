"""``flowrt.onnx``: the public ONNX entry points (``load``; ``flowrt.onnx.backend`` for conformance)."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from flowrt.frontends import onnx as _frontend

if TYPE_CHECKING:
    from flowrt.engine.graph.network import Network


def load(
    source: str | os.PathLike | bytes | Any, *, check: bool = True, memory_budget: int | None = None
) -> Network:
    from flowrt import network_cache

    return network_cache.load_onnx(
        source,
        check=check,
        memory_budget=memory_budget,
        parse=lambda: _frontend.load(source, check=check, memory_budget=memory_budget),
    )


load.__doc__ = (
    (_frontend.load.__doc__ or "")
    + """
    A file whose optimized network the cache holds (``flowrt.network_cache``) is parsed only
    when the network's graph is looked at: ``flowrt.optimize`` reads the cached result instead.
    """
)

__all__ = ["load"]
