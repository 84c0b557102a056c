"""The batching rules of Gather and GatherND: lookups into batched data.

Exporters write a mask lookup as GatherND (bert's, distilbert's and gpt2's attention mask:
``mask[0, j]`` for every position ``j``, i.e. the mask broadcast to the attention's shape),
and torch's ``as_strided`` as a Gather of constant positions along a flattened tensor
(convnext's and swin's layer norms). At batch 1 the indices address sample 0's elements; for
N samples each sample must read its own, so the indices are repeated for each sample, moved
to that sample's elements. Registered beside ``batch_rules`` (same contract).
"""

from __future__ import annotations

import numpy as np

from flowrt.engine.graph.graph import Graph, Layer, constant_value
from flowrt.engine.graph.passes.batch_rules import (
    Axis,
    Refused,
    Rewrite,
    batch_rule,
    batched_first,
    input_shape,
    replace_constant_input,
)
from flowrt.engine.graph.shapes import normalize_axis


@batch_rule("Gather")
def gather(layer: Layer, axes: list[Axis]) -> Axis | Rewrite:
    """A lookup into a constant table by batched indices keeps the indices' batch; batched data
    looked up along another axis keeps its batch axis. Along the batch's own axis (k rows of
    each sample at batch 1, ``batch_rules_reshape``), constant indices into those k rows are
    repeated for each sample, moved to its rows: the output holds the batch on that axis."""
    data, indices = input_shape(layer, 0), input_shape(layer, 1)
    along = normalize_axis(layer.descriptor.axis, len(data))
    if axes[0] is None:  # a lookup into a table by batched indices
        indices_axis = axes[1]
        assert indices_axis is not None  # a rule runs only where an input carries the batch
        return along + indices_axis
    batch = batched_first(axes)
    if batch != along:
        return batch if batch < along else batch + len(indices) - 1
    positions = constant_value(layer.inputs[1].source)
    if positions is None or positions.ndim == 0:
        raise Refused(f"it looks up along the batch axis {batch} by indices that are not a constant array")
    rows = data[batch]
    if not isinstance(rows, int) or np.any(positions < -rows) or np.any(positions >= rows):
        raise Refused(f"its indices reach past the {rows} rows of each sample on the batch axis {batch}")
    own = positions % rows

    def apply(graph: Graph, n: int) -> str:
        moved = np.concatenate([own + i * rows for i in range(n)], axis=0)
        replace_constant_input(graph, layer, 1, moved, "batch_indices")
        return f"re-batched Gather {layer.name!r}: indices moved to each of {n} samples' rows"

    return Rewrite(batch, apply)


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
