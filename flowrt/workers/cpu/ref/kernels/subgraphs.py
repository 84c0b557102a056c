"""What the kernels of layers with subgraphs (If, Loop, Scan) share: the runner of their
bodies they are called with, and the arithmetic of conditions and stacked outputs.

Such a kernel is called ``kernel(descriptor, *inputs, bodies=runner)``: ``runner.run(index,
inputs, outer)`` runs the layer's body ``index`` (an If's 0 then, 1 else) once on this thread,
its formal inputs ``inputs`` and the outer values ``outer`` (by name), and returns its
outputs in order; ``runner.empty_outputs`` are the infos of the layer's outputs when no
iteration runs (its inferred infos, or what the kind says onnxruntime makes then). The runner is
``flowrt.workers.cpu.ref.subgraph_workload.SubgraphWorkload``: it exists once a Runtime has
loaded the layer.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol

import numpy as np

from flowrt.errors import BackendError, ShapeError
from flowrt.types import TensorInfo


class Bodies(Protocol):
    """Runs a layer's bodies (see the module doc)."""

    empty_outputs: Sequence[TensorInfo]

    def run(
        self, index: int, inputs: Sequence[np.ndarray], outer: Mapping[str, np.ndarray]
    ) -> list[np.ndarray]: ...


def runner(bodies: Bodies | None, kind: str) -> Bodies:
    """``bodies``; BackendError when the kernel was called without one (outside a load)."""
    if bodies is None:
        raise BackendError(f"the CpuRef {kind} kernel runs its subgraphs through a loaded workload (bodies=)")
    return bodies


def one_element(value: np.ndarray, what: str) -> Any:
    """The one value of ``value`` (a condition, a trip count); ShapeError naming ``what`` when
    it holds more or none."""
    array = np.asarray(value)
    if array.size != 1:
        raise ShapeError(f"{what} must hold one element, got shape {array.shape}")
    return array.reshape(-1)[0]


def empty_output(info: TensorInfo) -> np.ndarray:
    """The output of no iteration: zeros of ``info``'s shape, its unknown dims 0 (of shape
    (0,) where its rank is unknown), as onnxruntime makes it."""
    shape = (0,) if info.shape is None else tuple(d if isinstance(d, int) else 0 for d in info.shape)
    return np.zeros(shape, dtype=info.dtype.numpy)


def stack(values: Sequence[np.ndarray], what: str) -> np.ndarray:
    """Per-iteration values stacked along a new first axis; ShapeError naming ``what`` when
    an iteration's value differs in shape or type from the first's."""
    first = values[0]
    for i, value in enumerate(values):
        if value.shape != first.shape or value.dtype != first.dtype:
            raise ShapeError(
                f"{what}: iteration {i} gives {value.dtype}{value.shape}, iteration 0 gave {first.dtype}{first.shape}; "
                "every iteration must give one shape"
            )
    return np.stack(values)
