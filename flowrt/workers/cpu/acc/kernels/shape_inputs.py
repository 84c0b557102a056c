"""The values of a layer's shape-like inputs: Slice's starts and ends, Expand's shape, Tile's
repeats, Split's lengths.

Exports nearly always make them constants: they are then read once, at load, and a run costs
no conversion. An input computed by the graph is read at each run; either way the values come
as tuples of ints that a kernel can key its plans on.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from flowrt.engine.graph.layers.reshape import const_ints
from flowrt.registry import WorkloadInfo

Values = tuple[tuple[int, ...] | None, ...]


def _ints(value: np.ndarray | None) -> tuple[int, ...] | None:
    ints = const_ints(value)
    return None if ints is None else tuple(ints)


class ShapeInputs:
    """Input slots ``first`` on of one layer, as tuples of ints (None for an absent input)."""

    def __init__(self, info: WorkloadInfo, first: int) -> None:
        self.slots = range(first, len(info.inputs))
        consts = list(info.constants) + [None] * (len(info.inputs) - len(info.constants))
        present = [i for i in self.slots if info.inputs[i] is not None]
        self.fixed: Values | None = None
        if all(consts[i] is not None for i in present):
            self.fixed = tuple(_ints(consts[i]) for i in self.slots)

    def values(self, inputs: Sequence[np.ndarray | None]) -> Values:
        """The values for this run: the constants read at load, else the run's inputs."""
        if self.fixed is not None:
            return self.fixed
        return tuple(_ints(inputs[i]) if i < len(inputs) else None for i in self.slots)
