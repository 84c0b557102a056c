"""The dataflow of a loaded network: workloads, the tensors between them, and segments. The
scheduler runs a dataflow and never reads a graph: ``flowrt.engine.loader`` compiles one.

A *segment* is a list of workloads that one worker runs back to back: one task in a run's
nursery and one crossing into a worker thread. Two ways to cut them:

- serial (the default): workloads in topological order, consecutive ones of the same
  placement in one segment, each segment after the one before. Where a network has a device
  placement, the order stays on one placement while the dependencies allow (a transformer's
  attention mask on the host beside its embeddings on the device: a segment each, not a
  segment per layer). Kernels split their own
  windows across the workers, so an all-host network is one segment and a run needs no more
  than one crossing — as the Compute Library runs a graph, layer after layer, each layer
  spread over every core.
- parallel branches: a segment is a chain of workloads on one backend, each member after
  the first reading the previous one's only output; independent segments (an inception
  block's branches) run concurrently on different workers. This pays when kernels are
  single-threaded and the branches are heavy.

*Placement*: a workload runs on the host, or on a device — a backend whose memory is not
host memory (capability ``host_memory`` False, GpuAcc). A device segment holds workloads of
one device backend; the executor enqueues it whole on that backend's queue actor. Where a
tensor crosses between host and device is decided here, once: each device segment lists the
host tensors it uploads first (``uploads``) and the tensors it made that the host reads
afterwards — a host workload, or the caller as a network output — which it downloads when
done (``downloads``).
"""

from __future__ import annotations

import attrs
import numpy as np

from flowrt.registry import Workload
from flowrt.types import TensorInfo


@attrs.frozen
class WorkloadNode:
    """One layer's workload and the tensor ids it reads and writes (None: absent or unread)."""

    layer: str
    kind: str
    backend: str
    workload: Workload
    inputs: tuple[int | None, ...]
    outputs: tuple[int | None, ...]


@attrs.frozen
class Segment:
    """Workloads that run in order on one worker; starts when ``depends_on`` segments are done.

    ``backend`` names the backend of its workloads (ids joined by "+" when they are several).
    A ``device`` segment runs on its backend's device (see the module docstring): it copies
    ``uploads`` from the host before its workloads and ``downloads`` to the host after them.
    """

    index: int
    backend: str
    nodes: tuple[WorkloadNode, ...]
    depends_on: frozenset[int]
    device: bool = False
    uploads: tuple[int, ...] = ()
    downloads: tuple[int, ...] = ()


@attrs.frozen
class Dataflow:
    """Everything a run needs: segments, constants, where inputs go and outputs come from."""

    segments: tuple[Segment, ...]
    constants: dict[int, np.ndarray] = attrs.field(eq=False)
    inputs: dict[str, int]
    input_infos: dict[str, TensorInfo]
    outputs: dict[str, int]
    output_infos: dict[str, TensorInfo | None]
    readers: dict[int, int]  # tensor id -> number of workloads that read it
    order: tuple[WorkloadNode, ...]  # every workload, in topological order
    tensor_infos: dict[int, TensorInfo]  # inferred info of each workload-produced tensor
    # Seconds each host segment's workloads took in its last run with a program (by segment
    # index): the executor runs the quick ones on its own thread (see executor.INLINE_S).
    host_costs: dict[int, float] = attrs.field(factory=dict, eq=False)
    # Seconds each of those took in its last run on the executor's thread (one thread).
    inline_costs: dict[int, float] = attrs.field(factory=dict, eq=False)

    @property
    def nodes(self) -> list[WorkloadNode]:
        return list(self.order)

    @property
    def downloads(self) -> frozenset[int]:
        """Every tensor a device segment copies to the host (into a new array, per run)."""
        return frozenset(t for s in self.segments for t in s.downloads)


def host_slots(node: WorkloadNode) -> frozenset[int]:
    """The input slots a device workload reads on the host (a reshape's target shape, say)."""
    return frozenset(getattr(node.workload, "host_inputs", ()))


def host_reads(dataflow: Dataflow) -> frozenset[int]:
    """The tensors the host reads: inputs of host segments' workloads, and the host slots of
    device workloads (``host_slots``)."""
    reads: set[int] = set()
    for segment in dataflow.segments:
        for node in segment.nodes:
            slots = host_slots(node) if segment.device else range(len(node.inputs))
            reads.update(t for i, t in enumerate(node.inputs) if i in slots and t is not None)
    return frozenset(reads)
