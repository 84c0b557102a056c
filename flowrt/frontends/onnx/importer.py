"""ONNX import: a model file (or ModelProto) becomes a flowrt Network.

Every node becomes a layer of the kind named by its op type (see ``descriptors.py`` for the
attribute rule, ``graph_importer.py`` for the graph and its subgraphs); initializers and
Constant nodes become Constant layers, including initializers that are also listed as graph
inputs (their values are the model's; ``load_with_initializer_inputs`` also names those, for
a session that lets a run override them). Text and tensors are checked first (see ``checks.py``); whatever else a malformed node
sets off is still a ModelLoadError naming the model and the node.
"""

from __future__ import annotations

import os
from pathlib import Path

import onnx
from google.protobuf.message import DecodeError

from flowrt.engine.graph.network import Network
from flowrt.engine.memory.budget import MemoryBudget, check_memory_budget
from flowrt.errors import ModelLoadError
from flowrt.frontends.onnx.checks import TensorReader, check_text
from flowrt.frontends.onnx.graph_importer import DEFAULT_DOMAINS, GraphImporter, tensor_info
from flowrt.gc_pause import collection_paused
from flowrt.types import TensorInfo


def read_model(source: str | os.PathLike | bytes | onnx.ModelProto) -> tuple[onnx.ModelProto, str]:
    """Parse a model from a path, bytes or a ModelProto; returns it and a name for messages."""
    if isinstance(source, onnx.ModelProto):
        check_text(source, "<ModelProto>")
        return source, "<ModelProto>"
    if isinstance(source, bytes):
        where = "<bytes>"
        data = source
        base_dir = None
    else:
        path = Path(source)
        where = str(path)
        if not path.exists():
            raise ModelLoadError(f"model file {where} does not exist")
        if not path.is_file():
            raise ModelLoadError(f"model path {where} is not a file")
        data = path.read_bytes()
        base_dir = str(path.parent)
    if not data:
        raise ModelLoadError(f"model file {where} is empty")
    model = onnx.ModelProto()
    try:
        model.ParseFromString(data)
    except (DecodeError, RuntimeError, ValueError) as e:
        raise ModelLoadError(
            f"model file {where} is not a valid ONNX protobuf (truncated or not a model): {e}"
        ) from e
    if not model.HasField("graph") or model.ir_version == 0:
        raise ModelLoadError(f"model file {where} is not an ONNX model: it has no graph or no IR version")
    check_text(model, where)
    if base_dir is not None and _uses_external_data(model):
        try:
            onnx.external_data_helper.load_external_data_for_model(model, base_dir)
        except (OSError, ValueError, onnx.checker.ValidationError) as e:
            raise ModelLoadError(f"model file {where}: cannot read its external data: {e}") from e
    return model, where


def _uses_external_data(model: onnx.ModelProto) -> bool:
    return any(t.data_location == onnx.TensorProto.EXTERNAL for t in model.graph.initializer)


def _check_acyclic(graph: onnx.GraphProto, where: str) -> None:
    """Raise ModelLoadError naming the nodes on a cycle, before onnx's checker calls it unsorted."""
    producer = {out: i for i, node in enumerate(graph.node) for out in node.output if out}
    state = [0] * len(graph.node)  # 0 new, 1 on stack, 2 done
    for start in range(len(graph.node)):
        stack = [(start, iter(graph.node[start].input))]
        state[start] = state[start] or 1
        while stack:
            i, it = stack[-1]
            nxt = next((producer[n] for n in it if n in producer), None)
            if nxt is None:
                state[i] = 2
                stack.pop()
            elif state[nxt] == 1:
                cycle = [graph.node[j].name or graph.node[j].op_type for j, _ in stack]
                raise ModelLoadError(f"model {where}: the graph has a cycle through nodes {', '.join(cycle)}")
            elif state[nxt] == 0:
                state[nxt] = 1
                stack.append((nxt, iter(graph.node[nxt].input)))


def _opset(model: onnx.ModelProto) -> int:
    versions = [o.version for o in model.opset_import if o.domain in DEFAULT_DOMAINS]
    return max(versions) if versions else 1


def load(
    source: str | os.PathLike | bytes | onnx.ModelProto,
    *,
    check: bool = True,
    memory_budget: int | None = None,
) -> Network:
    """Import an ONNX model as a Network.

    Raises ModelLoadError for a missing, empty, truncated or garbage file, for text that is not
    UTF-8, for a tensor whose data does not hold what its dims declare, and for a graph that
    fails onnx's checker or has a cycle; UnsupportedLayerError naming the op type, node and
    opset of an op flowrt does not know; ResourceError, naming the tensor, when the model's
    constants would pass ``memory_budget`` (bytes; None: half the machine's physical memory).
    """
    return _load(source, check, memory_budget)[0]


def load_with_initializer_inputs(
    source: str | os.PathLike | bytes | onnx.ModelProto,
    *,
    check: bool = True,
    memory_budget: int | None = None,
) -> tuple[Network, dict[str, TensorInfo]]:
    """``load``, and ONNX Runtime's overridable initializers: the initializers that a model of
    IR version 4 or later also lists among its graph inputs (an input with a default value),
    each with the info its graph input declares, in graph-input order. The network has them
    as Constant layers named after them, as every initializer."""
    network, model, where = _load(source, check, memory_budget)
    return network, _initializer_inputs(model, where)


@collection_paused()
def _load(
    source: str | os.PathLike | bytes | onnx.ModelProto, check: bool, memory_budget: int | None
) -> tuple[Network, onnx.ModelProto, str]:
    budget = MemoryBudget(
        check_memory_budget(memory_budget, "flowrt.onnx.load"), "flowrt.onnx.load(memory_budget=...)"
    )
    model, where = read_model(source)
    graph = model.graph
    _check_acyclic(graph, where)
    if check:
        try:
            onnx.checker.check_model(model)
        except Exception as e:  # a ValidationError; on some malformations a ValueError of its own
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise ModelLoadError(f"model {where} fails onnx's checker: {first}") from e
    try:
        network = _build(model, where, TensorReader(where, budget))
    except MemoryError as e:
        raise budget.out_of_memory(e, f"model {where}") from e
    return network, model, where


def _initializer_inputs(model: onnx.ModelProto, where: str) -> dict[str, TensorInfo]:
    # Before IR version 4 every initializer had to be listed as an input, so a listing says
    # nothing: ONNX Runtime lets none be overridden there.
    if model.ir_version < 4:
        return {}
    initializers = {init.name for init in model.graph.initializer}
    return {v.name: tensor_info(v, where) for v in model.graph.input if v.name in initializers}


def _build(model: onnx.ModelProto, where: str, reader: TensorReader) -> Network:
    importer = GraphImporter(where, _opset(model), reader)
    importer.add_graph(model.graph, list(model.graph.input))
    return importer.net
