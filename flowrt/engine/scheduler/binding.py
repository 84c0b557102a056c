"""A host segment's workloads bound to one memory pool: runs of small workloads as one call.

A pool's tensors never move, so a workload whose inputs are constants or tensors of the pool
reads and writes the same arrays in every run that borrows it. A workload that offers
``bind(inputs, outputs)`` may answer those fixed arrays with a bound call (or None); the
consecutive bound calls of one ``program`` become one :class:`BoundStep`, which runs them all
through one call that ``program.compile(calls)`` made (CpuAcc's: one native call for a chain
of recorded layers and small elementwise ones). The other workloads stay steps of their own.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, final

import attrs
import numpy as np

from flowrt.engine.scheduler.dataflow import Segment, WorkloadNode
from flowrt.errors import RunError


@final  # the executor tells a step from a WorkloadNode by ``type(step) is BoundStep``
@attrs.frozen(eq=False)
class BoundStep:
    """Consecutive bound workloads of a segment, run by one call; ``outputs`` are the arrays
    they leave in the pool, by tensor id, published to the run's values after the call."""

    nodes: tuple[WorkloadNode, ...]
    call: Callable[[], None]
    outputs: Mapping[int, np.ndarray]

    def run(self, values: dict[int, Any]) -> None:
        """Run the bound workloads and publish their outputs into ``values``."""
        try:
            self.call()
        except Exception as e:
            first = self.nodes[0]
            raise RunError(first.layer, first.backend, e) from e
        values.update(self.outputs)


def bind_segment(
    segment: Segment,
    constants: Mapping[int, np.ndarray],
    placement: Callable[[WorkloadNode], tuple[list[Any] | None, tuple[Any, ...], int, bool]],
    unbound: frozenset[str] = frozenset(),
) -> list[WorkloadNode | BoundStep]:
    """``segment``'s steps in the pool whose output views ``placement(node)`` gives
    (``(targets, views, produced, takes_job)``, as the executor records them); the layers
    named in ``unbound`` stay steps of their own."""
    fixed: dict[int, Any] = dict(constants)
    steps: list[WorkloadNode | BoundStep] = []
    run: list[tuple[WorkloadNode, Any]] = []

    def flush() -> None:
        if run:
            program = run[0][1].program
            outputs = {
                tid: array
                for node, call in run
                for tid, array in zip(node.outputs, call.outputs)
                if tid is not None
            }
            steps.append(BoundStep(tuple(n for n, _ in run), program.compile([c for _, c in run]), outputs))
            run.clear()

    for node in segment.nodes:
        views = placement(node)[1]
        call = None if node.layer in unbound else _bind(node, fixed, views)
        if call is None:
            flush()
            steps.append(node)
            # Planned outputs end in their pool views, whatever the workload returns.
            fixed.update((t, v) for t, v in zip(node.outputs, views) if t is not None and v is not None)
            continue
        if run and call.program is not run[0][1].program:
            flush()
        run.append((node, call))
        fixed.update((t, a) for t, a in zip(node.outputs, call.outputs) if t is not None)
    flush()
    return steps


def _bind(node: WorkloadNode, fixed: Mapping[int, Any], views: Sequence[Any]) -> Any:
    bind = getattr(node.workload, "bind", None)
    if bind is None or any(tid is not None and tid not in fixed for tid in node.inputs):
        return None
    return bind([None if tid is None else fixed[tid] for tid in node.inputs], list(views))
