"""ONNX import: a model file (or ModelProto) becomes a flowrt Network.

Every node becomes a layer of the kind named by its op type (see ``descriptors.py`` for the
attribute rule); initializers and Constant nodes become Constant layers, including
initializers that are also listed as graph inputs (their values are the model's).
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import onnx
from google.protobuf.message import DecodeError
from onnx import numpy_helper

from flowrt.engine.graph.graph import OutputSlot
from flowrt.engine.graph.layer_kind import known_layer_kinds
from flowrt.engine.graph.network import Network
from flowrt.errors import FlowrtError, ModelLoadError, UnsupportedLayerError
from flowrt.frontends.onnx.descriptors import attribute_value, make_descriptor, node_attributes
from flowrt.types import DataType, TensorInfo

DEFAULT_DOMAINS = ("", "ai.onnx")


def read_model(source: str | os.PathLike | bytes | onnx.ModelProto) -> tuple[onnx.ModelProto, str]:
    """Parse a model from a path, bytes or a ModelProto; returns it and a name for messages."""
    if isinstance(source, onnx.ModelProto):
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


def _tensor_info(value: onnx.ValueInfoProto, where: str) -> TensorInfo:
    tensor_type = value.type.tensor_type
    if not value.type.HasField("tensor_type"):
        raise UnsupportedLayerError(
            f"model {where}: input {value.name!r} is not a tensor; flowrt supports tensor inputs only"
        )
    try:
        dtype = DataType.from_numpy(onnx.helper.tensor_dtype_to_np_dtype(tensor_type.elem_type))
    except (KeyError, ValueError, FlowrtError) as e:
        name = onnx.TensorProto.DataType.Name(tensor_type.elem_type) if tensor_type.elem_type else "undefined"
        raise UnsupportedLayerError(
            f"model {where}: input {value.name!r} has element type {name}, which flowrt does not support"
        ) from e
    if not tensor_type.HasField("shape"):
        return TensorInfo(None, dtype)
    dims = [d.dim_value if d.HasField("dim_value") else (d.dim_param or None) for d in tensor_type.shape.dim]
    return TensorInfo(tuple(dims), dtype)


def _constant_node_value(node: onnx.NodeProto) -> np.ndarray:
    attr = node.attribute[0]
    if attr.name == "sparse_value":
        return _sparse(attr.sparse_value)
    value = attribute_value(attr)
    if attr.name in ("value_float", "value_floats"):
        return np.asarray(value, dtype=np.float32)
    if attr.name in ("value_int", "value_ints"):
        return np.asarray(value, dtype=np.int64)
    if attr.name in ("value_string", "value_strings"):
        return np.asarray(value, dtype=object)
    return np.asarray(value)


def _sparse(sparse: onnx.SparseTensorProto) -> np.ndarray:
    values = numpy_helper.to_array(sparse.values)
    indices = numpy_helper.to_array(sparse.indices)
    dense = np.zeros(tuple(sparse.dims), dtype=values.dtype)
    flat = indices if indices.ndim == 1 else np.ravel_multi_index(indices.T, dense.shape)
    dense.reshape(-1)[flat] = values
    return dense


def _opset(model: onnx.ModelProto) -> int:
    versions = [o.version for o in model.opset_import if o.domain in DEFAULT_DOMAINS]
    return max(versions) if versions else 1


def load(source: str | os.PathLike | bytes | onnx.ModelProto, *, check: bool = True) -> Network:
    """Import an ONNX model as a Network.

    Raises ModelLoadError for a missing, empty, truncated or garbage file and for a graph that
    fails onnx's checker or has a cycle; UnsupportedLayerError naming the op type, node and
    opset of an op flowrt does not know.
    """
    model, where = read_model(source)
    graph = model.graph
    _check_acyclic(graph, where)
    if check:
        try:
            onnx.checker.check_model(model)
        except onnx.checker.ValidationError as e:
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise ModelLoadError(f"model {where} fails onnx's checker: {first}") from e
    return _build(model, where)


def _build(model: onnx.ModelProto, where: str) -> Network:
    graph, opset = model.graph, _opset(model)
    known = set(known_layer_kinds())
    net = Network()
    tensors: dict[str, OutputSlot] = {}
    for init in graph.initializer:
        tensors[init.name] = net.add_constant(numpy_helper.to_array(init), name=init.name).outputs[0]
    for init in graph.sparse_initializer:
        tensors[init.values.name] = net.add_constant(_sparse(init), name=init.values.name).outputs[0]
    for value in graph.input:
        if value.name not in tensors:
            tensors[value.name] = net.add_input(value.name, _tensor_info(value, where)).outputs[0]
    pending = []
    for index, node in enumerate(graph.node):
        label = node.name or f"{node.op_type}_{index}"
        if node.domain not in DEFAULT_DOMAINS:
            raise UnsupportedLayerError(
                f"op {node.domain}.{node.op_type} (node {label!r}) is in a domain flowrt does not support"
            )
        if node.op_type == "Constant":
            tensors[node.output[0]] = net.add_constant(_constant_node_value(node), name=label).outputs[0]
            continue
        if node.op_type not in known:
            raise UnsupportedLayerError(
                f"op {node.op_type} (node {label!r}, opset {opset}) is not supported by flowrt"
            )
        descriptor = make_descriptor(
            node.op_type,
            node_attributes(node),
            opset=opset,
            num_outputs=len(node.output),
            where=f"node {label!r}",
        )
        layer = net.graph.add_layer(
            node.op_type, descriptor, name=label, num_inputs=len(node.input), num_outputs=len(node.output)
        )
        for name, out in zip(node.output, layer.outputs):
            if name:
                tensors[name] = out
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
