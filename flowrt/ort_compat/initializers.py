"""ONNX Runtime's overridable initializers: an initializer that a model (IR version 4 or later)
also lists among its graph inputs is that input's default value, which a run may replace by
feeding it (``session.get_overridable_initializers()`` lists them).

flowrt imports such an initializer as a Constant, so the optimizer folds and packs it as any
weight: that model serves every run that feeds none of them, at full speed. A run that feeds
some gets a model in which exactly those are Input layers (``as_inputs``), optimized and
loaded on its first use and kept for later runs, one per set of names (``VariantModels``).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from flowrt.engine.graph.graph import Graph
from flowrt.engine.graph.layers.io import InputDescriptor
from flowrt.engine.graph.network import Network
from flowrt.types import TensorInfo

if TYPE_CHECKING:
    from flowrt.loaded_network import LoadedNetwork


def fed_initializers(infos: Mapping[str, TensorInfo], feeds: Any) -> frozenset[str]:
    """The names in ``infos`` (the overridable initializers) that ``feeds`` gives values for;
    none when ``feeds`` is not a mapping (the run then says what is wrong with it)."""
    if not infos or not isinstance(feeds, Mapping):
        return frozenset()
    return frozenset(name for name in infos if name in feeds)


def as_inputs(network: Network | Graph, infos: Mapping[str, TensorInfo]) -> Network | Graph:
    """A copy of ``network``'s graph in which the Constant layer of each initializer named in
    ``infos`` is an Input layer of that name, taking that info; ``network`` itself when
    ``infos`` is empty. The ONNX importer names an initializer's Constant layer after it."""
    if not infos:
        return network
    graph = (network.graph if isinstance(network, Network) else network).copy()
    for name, info in infos.items():
        constant = graph.layers[name]
        if constant.kind != "Constant":
            raise AssertionError(f"layer {name!r} is a {constant.kind}, not the initializer's Constant")
        readers = list(constant.outputs[0].connections)
        graph.remove_layer(constant)
        layer = graph.add_layer("Input", InputDescriptor(name, info), name=name)
        for slot in readers:
            layer.outputs[0].connect(slot)
    graph.infer_shapes()
    return graph


class VariantModels:
    """The models a session made for runs that override initializers, one per set of names,
    each made by ``make(names)`` on first use (it optimizes and loads, so it blocks). Safe
    from any thread: a set asked for by two runs at once is made once."""

    def __init__(self, make: Callable[[frozenset[str]], LoadedNetwork]) -> None:
        self._make = make
        self._models: dict[frozenset[str], LoadedNetwork] = {}
        self._lock = threading.Lock()

    def get(self, names: frozenset[str]) -> LoadedNetwork:
        """The model in which ``names`` are inputs."""
        with self._lock:
            model = self._models.get(names)
            if model is None:
                model = self._models[names] = self._make(names)
            return model

    def models(self) -> list[LoadedNetwork]:
        """The models made so far."""
        with self._lock:
            return list(self._models.values())
