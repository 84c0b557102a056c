"""ONNX import: a model file (or ModelProto) becomes a flowrt Network.

Every node becomes a layer of the kind named by its op type (see ``descriptors.py`` for the
attribute rule); initializers and Constant nodes become Constant layers, including
initializers that are also listed as graph inputs (their values are the model's;
``load_with_initializer_inputs`` also names those, for a session that lets a run override
them). Text and tensors are checked first (see ``checks.py``); whatever else a malformed node
sets off is still a ModelLoadError naming the model and the node.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import onnx
from google.protobuf.message import DecodeError

from flowrt.engine.graph.graph import Layer, OutputSlot
from flowrt.engine.graph.layer_kind import known_layer_kinds
from flowrt.engine.graph.layers.elementwise import onnx_dtype_to_datatype
from flowrt.engine.graph.network import Network
from flowrt.engine.memory.budget import MemoryBudget, check_memory_budget
from flowrt.errors import FlowrtError, ModelLoadError, UnsupportedLayerError
from flowrt.frontends.onnx.checks import TensorReader, check_text
from flowrt.frontends.onnx.descriptors import attribute_value, make_descriptor, node_attributes
from flowrt.types import TensorInfo

DEFAULT_DOMAINS = ("", "ai.onnx")


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


def _type_name(elem_type: int) -> str:
    """ONNX's name of an element type, or its number when ONNX has none."""
    if not elem_type:
        return "undefined"
    try:
        return onnx.TensorProto.DataType.Name(elem_type)
    except ValueError:
        return f"{elem_type} (not an ONNX type)"


def _tensor_info(value: onnx.ValueInfoProto, where: str) -> TensorInfo:
    tensor_type = value.type.tensor_type
    if not value.type.HasField("tensor_type"):
        raise UnsupportedLayerError(
            f"model {where}: input {value.name!r} is not a tensor; flowrt supports tensor inputs only"
        )
    try:
        # flowrt's own table: older onnx maps bfloat16, float8 and int4 to other numpy dtypes.
        dtype = onnx_dtype_to_datatype(tensor_type.elem_type)
    except FlowrtError as e:
        name = _type_name(tensor_type.elem_type)
        raise UnsupportedLayerError(
            f"model {where}: input {value.name!r} has element type {name}, which flowrt does not support"
        ) from e
    if not tensor_type.HasField("shape"):
        return TensorInfo(None, dtype)
    dims = [d.dim_value if d.HasField("dim_value") else (d.dim_param or None) for d in tensor_type.shape.dim]
    if any(isinstance(d, int) and d < 0 for d in dims):
        raise ModelLoadError(f"model {where}: input {value.name!r} has dims {dims}; dims must be >= 0")
    return TensorInfo(tuple(dims), dtype)


def _constant_node_value(node: onnx.NodeProto, label: str, reader: TensorReader) -> np.ndarray:
    what = f"model {reader.where}: Constant node {label!r}"
    if len(node.attribute) != 1 or len(node.output) != 1:
        raise ModelLoadError(
            f"{what}: expected one attribute and one output, found {len(node.attribute)} and {len(node.output)}"
        )
    attr = node.attribute[0]
    if attr.name == "sparse_value":
        return reader.sparse(attr.sparse_value, f"{what}: sparse_value")
    value = attribute_value(attr, read_tensor=reader.array, where=what)
    if attr.name in ("value_float", "value_floats"):
        return np.asarray(value, dtype=np.float32)
    if attr.name in ("value_int", "value_ints"):
        return np.asarray(value, dtype=np.int64)
    if attr.name in ("value_string", "value_strings"):
        return np.asarray(value, dtype=object)
    return np.asarray(value)


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
    return {v.name: _tensor_info(v, where) for v in model.graph.input if v.name in initializers}


def _build(model: onnx.ModelProto, where: str, reader: TensorReader) -> Network:
    graph = model.graph
    importer = _Importer(where, _opset(model), reader)
    net, tensors = importer.net, importer.tensors
    for init in graph.initializer:
        value = reader.array(init, f"model {where}: initializer {init.name!r}")
        importer.produce(init.name, net.add_constant(value, name=init.name).outputs[0], "an initializer")
    for init in graph.sparse_initializer:
        value = reader.sparse(init, f"model {where}: sparse initializer {init.values.name!r}")
        importer.produce(
            init.values.name, net.add_constant(value, name=init.values.name).outputs[0], "an initializer"
        )
    for value in graph.input:
        if value.name not in tensors:
            tensors[value.name] = net.add_input(value.name, _tensor_info(value, where)).outputs[0]
    pending = []
    for index, node in enumerate(graph.node):
        label = node.name or f"{node.op_type}_{index}"
        try:
            layer = importer.add_node(node, label)
        except FlowrtError:
            raise
        except Exception as e:  # whatever a malformed node sets off is still a malformed model
            raise ModelLoadError(
                f"model {where}: node {label!r} ({node.op_type}) cannot be imported: {type(e).__name__}: {e}"
            ) from e
        if layer is not None:
            pending.append((node, layer, label))
    for node, layer, label in pending:
        for name, slot in zip(node.input, layer.inputs):
            if not name:
                continue
            if name not in tensors:
                raise ModelLoadError(
                    f"model {where}: node {label!r} reads tensor {name!r}, which nothing produces"
                )
            tensors[name].connect(slot)
    for value in graph.output:
        if value.name not in tensors:
            raise ModelLoadError(f"model {where}: graph output {value.name!r} is produced by no node")
        net.add_output(value.name, tensors[value.name])
    return net


class _Importer:
    """The network being built from one model, and the tensors its nodes have produced so far."""

    def __init__(self, where: str, opset: int, reader: TensorReader) -> None:
        self.where, self.opset, self.reader = where, opset, reader
        self.net = Network()
        self.tensors: dict[str, OutputSlot] = {}
        self.known = set(known_layer_kinds())

    def add_node(self, node: onnx.NodeProto, label: str) -> Layer | None:
        """Add ``node`` as a layer (its outputs recorded in ``tensors``); None for a Constant
        node, which becomes a Constant layer."""
        if node.domain not in DEFAULT_DOMAINS:
            raise UnsupportedLayerError(
                f"op {node.domain}.{node.op_type} (node {label!r}) is in a domain flowrt does not support"
            )
        if node.op_type == "Constant":
            value = _constant_node_value(node, label, self.reader)
            self.produce(
                node.output[0], self.net.add_constant(value, name=label).outputs[0], f"node {label!r}"
            )
            return None
        if node.op_type not in self.known:
            raise UnsupportedLayerError(
                f"op {node.op_type} (node {label!r}, opset {self.opset}) is not supported by flowrt"
            )
        where = f"node {label!r}"
        attributes = node_attributes(
            node, read_tensor=self.reader.array, where=f"model {self.where}: {where}"
        )
        descriptor = make_descriptor(
            node.op_type, attributes, opset=self.opset, num_outputs=len(node.output), where=where
        )
        layer = self.net.graph.add_layer(
            node.op_type, descriptor, name=label, num_inputs=len(node.input), num_outputs=len(node.output)
        )
        for name, out in zip(node.output, layer.outputs):
            if name:
                self.produce(name, out, f"node {label!r}")
        return layer

    def produce(self, name: str, slot: OutputSlot, producer: str) -> None:
        """Record that ``producer`` makes tensor ``name``: once only (ONNX graphs are in
        single-assignment form; a second producer would silently replace the first)."""
        if name in self.tensors:
            raise ModelLoadError(
                f"model {self.where}: {producer} writes tensor {name!r}, which another node or "
                "initializer already writes; each tensor has one producer"
            )
        self.tensors[name] = slot
