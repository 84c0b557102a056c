"""The CpuRef workload of a layer with subgraphs (If, Loop, Scan): its bodies run as nested
dataflows, by the executor's own loop, on the thread that runs the layer.

At load, ``prepare`` specializes each body for the layer's input infos (a captured outer
value that is a constant becomes a Constant of the body, so the body's passes fold what it
feeds) and optimizes it for CpuRef; the loader then compiles each into a dataflow
(``load_subgraphs``, see ``flowrt.engine.loader.dataflow_builder``). A run of a branch or an
iteration is one ``run_nested`` of that dataflow: no thread crossing, no memory pool (each
body's tensors are fresh arrays, as CpuRef's kernels make them).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from flowrt.engine.graph.graph import Graph
from flowrt.engine.graph.layers.subgraph_body import subgraphs_of
from flowrt.engine.graph.optimizer import optimize
from flowrt.engine.scheduler.dataflow import Dataflow
from flowrt.engine.scheduler.executor import run_nested
from flowrt.errors import BackendError, DataTypeError, ShapeError
from flowrt.registry import BackendRegistry, WorkloadInfo
from flowrt.types import TensorInfo
from flowrt.workers.cpu.ref.kernels import RefKernel
from flowrt.workers.cpu.ref.workload_factory import RefWorkload


@functools.cache
def _ref_registry() -> BackendRegistry:
    """A registry of CpuRef alone: what a body is optimized for, whatever the caller's holds."""
    from flowrt.workers.cpu.ref.backend import DEFAULT_RANK, RefBackend  # the backend imports this module

    registry = BackendRegistry()
    registry.register("CpuRef", RefBackend, DEFAULT_RANK)
    return registry


class SubgraphWorkload(RefWorkload):
    """A layer whose kernel runs subgraphs: the kernel is called with ``bodies=self`` (see
    ``flowrt.workers.cpu.ref.kernels.subgraphs``)."""

    def __init__(self, kernel: RefKernel, info: WorkloadInfo) -> None:
        super().__init__(kernel, info)
        self.bodies = subgraphs_of(info.descriptor)
        self.empty_outputs: Sequence[TensorInfo] = info.outputs
        self.subgraphs: list[Graph] = []
        # Bodies whose shapes cannot be inferred from the layer's inputs, and why: a run that
        # takes one fails.
        self.unfit: dict[int, Exception] = {}
        self.dataflows: list[Dataflow] | None = None

    def prepare(self) -> None:
        """Specialize and optimize each body for CpuRef (once, at load)."""
        desc = self.info.descriptor
        empty = getattr(desc, "empty_outputs", None)  # Loop's: the shapes onnxruntime gives them
        if empty is not None:
            self.empty_outputs = empty(self.info.inputs, self.info.outputs)
        captured = self.info.constants[len(self.info.inputs) - len(desc.captures) :]
        constants = dict(zip(desc.captures, captured))
        self.subgraphs, self.unfit = [], {}
        for index, (body, infos) in enumerate(zip(self.bodies, desc.body_inputs(self.info.inputs))):
            values = [*[None] * len(body.inputs), *(constants.get(name) for name in body.captures)]
            try:
                graph = body.specialize(infos, values)
            except (ShapeError, DataTypeError) as e:  # an If branch for other inputs (see its kind)
                self.unfit[index] = e
                graph = Graph()
            self.subgraphs.append(optimize(graph, ["CpuRef"], registry=_ref_registry()).graph)

    def load_subgraphs(self, compile: Callable[[Graph], Dataflow]) -> None:
        """Take each prepared body compiled into a dataflow (the loader calls this)."""
        self.dataflows = [compile(graph) for graph in self.subgraphs]

    def execute(self, inputs: Sequence[np.ndarray | None]) -> list[np.ndarray]:
        if self.dataflows is None:
            raise BackendError(
                f"layer {self.info.layer_name!r} ({self.info.kind}) runs its subgraphs as nested dataflows, "
                "which a Runtime's load compiles: load the network to run it"
            )
        result = self.kernel(self.info.descriptor, *inputs, bodies=self)
        outputs = [np.asarray(o) for o in result[: len(self.info.outputs)]]
        # A body may hand back what it was fed (a captured value, a slice of a scan input):
        # an output never shares the memory of an input, which the run may reuse after.
        given = [i for i in inputs if isinstance(i, np.ndarray)]
        return [o.copy() if any(np.may_share_memory(o, i) for i in given) else o for o in outputs]

    def run(
        self, index: int, inputs: Sequence[np.ndarray], outer: Mapping[str, np.ndarray]
    ) -> list[np.ndarray]:
        """Run body ``index`` once on ``inputs`` (its formal inputs) and ``outer`` (the values
        of its captures, by name); returns its outputs in order."""
        assert self.dataflows is not None  # execute checked
        body = self.bodies[index]
        if index in self.unfit:
            error = self.unfit[index]
            raise type(error)(f"its {body.name} cannot run on these inputs: {error}")
        feeds: dict[str, Any] = dict(outer)
        feeds.update(zip(body.inputs, inputs))
        results = run_nested(self.dataflows[index], feeds)
        return [results[name] for name in body.outputs]
