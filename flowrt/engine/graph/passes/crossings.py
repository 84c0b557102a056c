"""Where data crosses between backends: the copies and zero-copy imports of a mixed network.

Arm NN inserts a MemCopy layer where a tensor moves between backends whose memory differs
and a MemImport where both can read the same memory. flowrt records the same decisions per
tensor; the dataflow carries them out (``flowrt.engine.scheduler.dataflow``): a backend
whose memory is not host memory (capability ``host_memory`` False) gets an upload of each
host tensor it reads and a download of each tensor it makes that the host reads — a host
backend's layer or the caller, for a network output. Between two host-memory backends
(CpuRef, CpuAcc) the tensor is read where it is: an import, no copy.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs

from flowrt.engine.graph.graph import Graph, Layer, OutputSlot

HOST = "host"


@attrs.frozen
class Crossing:
    """One tensor read across a backend boundary: ``copy`` between memories, or ``import``.

    ``tensor`` is ``"layer:output index"``; ``source`` and ``target`` are backend ids
    (``host`` for the network's inputs and outputs); ``readers`` the layers (or ``output
    'name'``) reading it on the other side.
    """

    tensor: str
    source: str
    target: str
    method: str = attrs.field(validator=attrs.validators.in_(("copy", "import")))
    readers: tuple[str, ...] = ()

    def describe(self) -> str:
        where = "zero-copy import" if self.method == "import" else "copy"
        return f"{self.tensor}: {self.source} -> {self.target} ({where}) for {', '.join(self.readers)}"


def _domain(backend: str, on_host: Mapping[str, bool]) -> str:
    """The memory a backend's tensors live in: the host's, or the backend's own."""
    return HOST if backend == HOST or on_host.get(backend, True) else backend


def _place(layer: Layer) -> str:
    return layer.backend or HOST


def _reader(layer: Layer) -> str:
    return f"output {layer.descriptor.name!r}" if layer.kind == "Output" else repr(layer.name)


def _crossings_of(out: OutputSlot, on_host: Mapping[str, bool]) -> list[Crossing]:
    source = _place(out.layer)
    by_target: dict[str, list[Layer]] = {}
    for destination in out.connections:
        target = _place(destination.layer)
        # The caller's arrays are host memory: a host backend reads and writes them in place.
        at_edge = HOST in (source, target) and _domain(source, on_host) == _domain(target, on_host)
        if target != source and not at_edge:
            by_target.setdefault(target, []).append(destination.layer)
    tensor = f"{out.layer.name}:{out.index}"
    records: dict[tuple[str, str], list[str]] = {}
    for target, readers in by_target.items():
        same_memory = _domain(source, on_host) == _domain(target, on_host)
        # One copy per memory: every host backend reading a device tensor shares one download.
        key = ("import", target) if same_memory else ("copy", _domain(target, on_host))
        records.setdefault(key, []).extend(_reader(r) for r in readers)
    return [
        Crossing(tensor, source, target, method, tuple(readers))
        for (method, target), readers in records.items()
    ]


def find_crossings(graph: Graph, capabilities: Mapping[str, Mapping[str, Any]]) -> list[Crossing]:
    """Every tensor that crosses between backends (or between a device backend and the
    caller), in execution order. Constants are not listed: each backend takes its own at load."""
    on_host = {bid: bool(c.get("host_memory", True)) for bid, c in capabilities.items()}
    found = []
    for layer in graph.topological_order():
        if layer.kind == "Constant":
            continue
        for out in layer.outputs:
            found += _crossings_of(out, on_host)
    return found
