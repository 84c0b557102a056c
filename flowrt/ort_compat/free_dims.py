"""``SessionOptions.add_free_dimension_override_by_name``: symbolic input dims made fixed."""

from __future__ import annotations

import logging
from collections.abc import Mapping

import attrs

from flowrt.engine.graph.graph import Graph
from flowrt.engine.graph.network import Network

logger = logging.getLogger(__name__)


def override_free_dims(network: Network | Graph, overrides: Mapping[str, int]) -> Network | Graph:
    """``network`` with every input dim named in ``overrides`` set to its value (a copy of its
    graph, shapes inferred again); ``network`` itself when there is nothing to override."""
    if not overrides:
        return network
    graph = (network.graph if isinstance(network, Network) else network).copy()
    used: set[str] = set()
    for layer in graph.input_layers:
        info = layer.descriptor.info
        if info.shape is None:
            continue
        shape = tuple(overrides.get(d, d) if isinstance(d, str) else d for d in info.shape)
        if shape != info.shape:
            used.update(d for d in info.shape if isinstance(d, str) and d in overrides)
            layer.descriptor = attrs.evolve(layer.descriptor, info=info.with_shape(shape))
    unused = sorted(set(overrides) - used)
    if unused:
        logger.info("free dimension overrides %s name no input dimension of the model", unused)
    graph.infer_shapes()
    return graph
