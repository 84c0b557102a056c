"""Compile an optimized graph into the dataflow the scheduler runs: tensor ids, workloads,
segments and where tensors cross between host and device (the cuts and the placement are
described in ``flowrt.engine.scheduler.dataflow``).
"""

from __future__ import annotations

import heapq
from collections.abc import Callable

import attrs

from flowrt.engine.graph.graph import Graph, Layer, OutputSlot, workload_info
from flowrt.engine.scheduler.dataflow import Dataflow, Segment, WorkloadNode, host_slots
from flowrt.registry import Workload, WorkloadInfo
from flowrt.types import TensorInfo

WorkloadMaker = Callable[[Layer, WorkloadInfo], Workload]


def build_dataflow(
    graph: Graph,
    make_workload: WorkloadMaker,
    *,
    parallel_branches: bool = False,
    device_backends: frozenset[str] = frozenset(),
    fast_math: bool = False,
    fp16_weights: bool = False,
) -> Dataflow:
    """Compile an optimized graph into a dataflow; ``make_workload`` builds each layer's workload.

    A workload whose layer runs subgraphs (If, Loop, Scan) offers ``load_subgraphs(compile)``:
    it calls ``compile(graph)`` on each subgraph it prepared (optimized, every layer assigned
    a backend), which compiles it here into a dataflow of its own, its workloads made by
    ``make_workload`` too; the workload runs those nested dataflows with
    ``flowrt.engine.scheduler.executor.run_nested``.

    ``parallel_branches`` cuts independent branches into segments of their own (see
    ``flowrt.engine.scheduler.dataflow``).
    ``device_backends`` names the backends whose workloads run on a device.
    ``fast_math`` and ``fp16_weights``, the network's options, go to every workload's
    ``WorkloadInfo``.
    """
    ids: dict[tuple[str, int], int] = {}

    def tensor_id(slot: OutputSlot) -> int:
        return ids.setdefault((slot.layer.name, slot.index), len(ids))

    constants, inputs, input_infos, outputs, output_infos = {}, {}, {}, {}, {}
    infos: dict[int, TensorInfo] = {}
    nodes: list[tuple[Layer, WorkloadNode]] = []
    for layer in graph.topological_order():
        if layer.kind == "Constant":
            constants[tensor_id(layer.outputs[0])] = layer.descriptor.value
        elif layer.kind == "Input":
            inputs[layer.descriptor.name] = tensor_id(layer.outputs[0])
            input_infos[layer.descriptor.name] = layer.descriptor.info
        elif layer.kind == "Output":
            source = layer.inputs[0].source
            assert source is not None  # a validated graph connects every Output
            outputs[layer.descriptor.name] = tensor_id(source)
            output_infos[layer.descriptor.name] = source.info
        else:
            assert layer.backend is not None  # the optimizer assigned every compute layer
            info = workload_info(layer, fast_math, fp16_weights)
            workload = make_workload(layer, info)
            load_subgraphs = getattr(workload, "load_subgraphs", None)
            if load_subgraphs is not None:
                load_subgraphs(
                    lambda subgraph: build_dataflow(
                        subgraph, make_workload, fast_math=fast_math, fp16_weights=fp16_weights
                    )
                )
            node = WorkloadNode(
                layer.name,
                layer.kind,
                layer.backend,
                workload,
                tuple(tensor_id(s.source) if s.source else None for s in layer.inputs),
                tuple(tensor_id(o) if o.connections else None for o in layer.outputs),
            )
            nodes.append((layer, node))
            for tid, out in zip(node.outputs, layer.outputs):
                if tid is not None:
                    assert out.info is not None  # shapes were inferred, and the output is read
                    infos[tid] = out.info
    # Inputs and outputs keep the network's declared order, not the execution order.
    inputs = {layer.descriptor.name: inputs[layer.descriptor.name] for layer in graph.input_layers}
    outputs = {layer.descriptor.name: outputs[layer.descriptor.name] for layer in graph.output_layers}
    output_infos = {name: output_infos[name] for name in outputs}
    readers: dict[int, int] = {}
    for _, node in nodes:
        for tid in node.inputs:
            if tid is not None and tid not in constants:
                readers[tid] = readers.get(tid, 0) + 1
    if parallel_branches:
        segments = _branch_segments(nodes)
    else:
        nodes = _grouped_by_placement(nodes, device_backends)
        segments = _serial_segments(nodes, device_backends)
    return Dataflow(
        _place(segments, device_backends, set(constants), set(outputs.values())),
        constants,
        inputs,
        input_infos,
        outputs,
        output_infos,
        readers,
        tuple(node for _, node in nodes),
        infos,
    )


def _compute_producers(layer: Layer) -> list[Layer]:
    return [p for p in dict.fromkeys(layer.producers()) if p.kind not in ("Constant", "Input")]


def _grouped_by_placement(
    nodes: list[tuple[Layer, WorkloadNode]], device_backends: frozenset[str]
) -> list[tuple[Layer, WorkloadNode]]:
    """``nodes`` (in topological order) in a topological order that stays on one placement (the
    host, or one device backend) while it can: of the nodes whose producers have all come, the
    first (in the given order) of the placement of the node before, else the first of any.
    Independent chains on the host and on a device (a transformer's attention mask beside its
    embeddings) then form a segment each, where the given order interleaved them into a
    segment per layer, each device one a submission; a network on one placement keeps its
    order."""
    if not device_backends:
        return nodes
    position = {layer.name: i for i, (layer, _) in enumerate(nodes)}
    waiting: dict[str, int] = {}
    consumers: dict[str, list[int]] = {}
    for i, (layer, _) in enumerate(nodes):
        producers = [p.name for p in _compute_producers(layer) if p.name in position]
        waiting[layer.name] = len(producers)
        for name in producers:
            consumers.setdefault(name, []).append(i)
    places = [node.backend if node.backend in device_backends else None for _, node in nodes]
    ready: dict[str | None, list[int]] = {}
    for i, (layer, _) in enumerate(nodes):
        if waiting[layer.name] == 0:
            heapq.heappush(ready.setdefault(places[i], []), i)
    ordered: list[tuple[Layer, WorkloadNode]] = []
    current = places[0] if nodes else None
    while len(ordered) < len(nodes):
        if not ready.get(current):
            current = min((heap[0], place) for place, heap in ready.items() if heap)[1]
        i = heapq.heappop(ready[current])
        ordered.append(nodes[i])
        for j in consumers.get(nodes[i][0].name, ()):
            name = nodes[j][0].name
            waiting[name] -= 1
            if waiting[name] == 0:
                heapq.heappush(ready.setdefault(places[j], []), j)
    return ordered


def _serial_segments(
    nodes: list[tuple[Layer, WorkloadNode]], device_backends: frozenset[str]
) -> tuple[Segment, ...]:
    """Consecutive workloads of one placement (the host, or one device backend) per segment."""
    runs: list[tuple[str | None, list[WorkloadNode]]] = []
    for _, node in nodes:
        place = node.backend if node.backend in device_backends else None
        if runs and runs[-1][0] == place:
            runs[-1][1].append(node)
        else:
            runs.append((place, [node]))
    return tuple(
        Segment(
            i,
            "+".join(dict.fromkeys(node.backend for node in members)),
            tuple(members),
            frozenset({i - 1}) if i else frozenset(),
        )
        for i, (_, members) in enumerate(runs)
    )


def _place(
    segments: tuple[Segment, ...], device_backends: frozenset[str], constants: set[int], outputs: set[int]
) -> tuple[Segment, ...]:
    """Mark the device segments and the host/device crossings (see the module docstring).

    Constants are never uploaded: device workloads upload their own at load. A tensor is
    uploaded once per run, by the first device segment that needs it; a later one reuses the
    copy when it runs after that segment (in the parallel-branch cut, only then).
    """
    device = [bool(s.nodes) and all(n.backend in device_backends for n in s.nodes) for s in segments]
    on_device = {
        t for s, d in zip(segments, device) if d for n in s.nodes for t in n.outputs if t is not None
    }
    host_reads = set(outputs)
    for s, d in zip(segments, device):
        for node in s.nodes:
            slots = host_slots(node) if d else range(len(node.inputs))
            host_reads.update(t for i, t in enumerate(node.inputs) if i in slots and t is not None)
    ancestors: list[set[int]] = []
    uploaded: list[set[int]] = []  # by each segment or one before it
    placed = []
    for s, d in zip(segments, device):
        ancestors.append(set().union(*({a, *ancestors[a]} for a in s.depends_on)))
        before = set().union(*(uploaded[a] for a in ancestors[-1]))
        uploads: list[int] = []
        downloads: list[int] = []
        if d:
            present = on_device | constants | before
            for node in s.nodes:
                slots = host_slots(node)
                for i, t in enumerate(node.inputs):
                    if t is not None and i not in slots and t not in present:
                        uploads.append(t)
                        present.add(t)
            made = (t for node in s.nodes for t in node.outputs if t is not None)
            downloads = [t for t in made if t in host_reads]
        uploaded.append(before | set(uploads))
        placed.append(attrs.evolve(s, device=d, uploads=tuple(uploads), downloads=tuple(downloads)))
    return tuple(placed)


def _branch_segments(nodes: list[tuple[Layer, WorkloadNode]]) -> tuple[Segment, ...]:
    segment_of: dict[str, int] = {}
    members: list[list[WorkloadNode]] = []
    backends: list[str] = []
    deps: list[set[int]] = []
    for layer, node in nodes:
        producers = _compute_producers(layer)
        chain = None
        if len(producers) == 1:
            prev = producers[0]
            seg = segment_of[prev.name]
            only_reader = len([c for c in prev.consumers()]) == 1
            if only_reader and backends[seg] == node.backend and members[seg][-1].layer == prev.name:
                chain = seg
        if chain is None:
            chain = len(members)
            members.append([])
            backends.append(node.backend)
            deps.append({segment_of[p.name] for p in producers})
        members[chain].append(node)
        segment_of[layer.name] = chain
    return tuple(Segment(i, backends[i], tuple(members[i]), frozenset(deps[i])) for i in range(len(members)))
