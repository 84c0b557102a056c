"""The batching rule of GatherND: constant indices into batched data.

Exporters write a mask lookup as GatherND (bert's, distilbert's and gpt2's attention mask:
``mask[0, j]`` for every position ``j``, i.e. the mask broadcast to the attention's shape). At
batch 1 the indices address sample 0; for N samples each sample must read its own row, so the
indices are repeated for each sample with the sample's index in place of 0. Registered beside
``batch_rules`` (same contract).
"""

from __future__ import annotations

import numpy as np

from flowrt.engine.graph.graph import Graph, Layer, constant_value
from flowrt.engine.graph.passes.batch_rules import (
    Axis,
    Refused,
    Rewrite,
    batch_rule,
    input_shape,
    replace_constant_input,
)


def _sample_indices(indices: np.ndarray, n: int, coordinate: bool) -> np.ndarray:
    """``indices`` (1 on axis 0) repeated for ``n`` samples; with ``coordinate``, the first
    coordinate (which addressed sample 0) set to each sample's index."""
    repeated = np.repeat(indices, n, axis=0)
    if coordinate:
        repeated[..., 0] = np.arange(n).reshape((n,) + (1,) * (repeated.ndim - 2))
    return repeated


@batch_rule("GatherND")
def gather_nd(layer: Layer, axes: list[Axis]) -> Axis | Rewrite:
    """Data carries the batch, the indices are a constant. With the batch on a dim of data the
    indices do not address (past ``batch_dims`` + their last dim) the lookup leaves it alone;
    with the batch on axis 0 and the indices made for one sample (1 on their axis 0, and, where
    axis 0 is addressed, coordinate 0 everywhere), they are repeated for each sample."""
    batch = axes[0]
    if batch is None or axes[1] is not None:
        raise Refused("only batched data with indices that do not carry the batch is re-batched")
    indices = constant_value(layer.inputs[1].source)
    if indices is None:
        raise Refused("its indices are computed at run time; only constant indices are re-batched")
    data = input_shape(layer, 0)
    batch_dims = layer.descriptor.batch_dims
    depth = indices.shape[-1]
    if batch >= batch_dims + depth:  # a dim of data the lookup keeps whole
        return indices.ndim - 1 + batch - depth
    if batch != 0 or data[0] != 1 or indices.shape[0] != 1:
        raise Refused(f"the batch is on axis {batch}, which its indices {indices.shape} address")
    coordinate = batch_dims == 0
    if coordinate and np.any(indices[..., 0] != 0):
        raise Refused("its indices read more than sample 0 of the batch-1 data")

    def apply(graph: Graph, n: int) -> str:
        replace_constant_input(graph, layer, 1, _sample_indices(indices, n, coordinate), "batch_indices")
        return f"re-batched GatherND {layer.name!r}: indices repeated for each of {n} samples"

    return Rewrite(0, apply)
