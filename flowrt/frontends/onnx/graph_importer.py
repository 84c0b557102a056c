"""One ONNX graph made layers of a Network: the model's main graph, or a subgraph of a
control-flow node (If's branches, Loop's and Scan's body) made a
:class:`~flowrt.engine.graph.layers.subgraph_body.Body`.

Every node becomes a layer of the kind named by its op type (see ``descriptors.py`` for the
attribute rule); initializers and Constant nodes become Constant layers. A subgraph may read
any value of the graphs that enclose it by name: each such name becomes an Input layer of the
body (a *capture*) and an extra input of the node's layer, which its own graph resolves in
turn, so a Loop inside an If branch that reads a main-graph value makes both layers take it.
"""

from __future__ import annotations

import numpy as np
import onnx

from flowrt.engine.graph.graph import Layer, OutputSlot
from flowrt.engine.graph.layer_kind import known_layer_kinds
from flowrt.engine.graph.layers.elementwise import onnx_dtype_to_datatype
from flowrt.engine.graph.layers.subgraph_body import PLACEHOLDER, Body
from flowrt.engine.graph.network import Network
from flowrt.errors import FlowrtError, ModelLoadError, UnsupportedLayerError
from flowrt.frontends.onnx.checks import TensorReader
from flowrt.frontends.onnx.descriptors import attribute_value, make_descriptor, node_attributes
from flowrt.types import Dim, TensorInfo

DEFAULT_DOMAINS = ("", "ai.onnx")
# ONNX Runtime's contrib operators flowrt runs, as its layer kinds of the same names with ONNX
# Runtime's inputs and attributes: what ``onnxruntime.quantization`` writes in its QOperator
# format. Any other op of that domain is refused (some share a name with an ONNX op of another
# meaning, such as Attention).
CONTRIB_DOMAIN = "com.microsoft"
CONTRIB_KINDS = frozenset({
    "QLinearAdd", "QLinearMul", "QGemm", "QLinearGlobalAveragePool", "QLinearAveragePool",
    "QLinearSoftmax", "QLinearSigmoid", "QLinearLeakyRelu", "QLinearConcat",
})  # fmt: skip


def _type_name(elem_type: int) -> str:
    """ONNX's name of an element type, or its number when ONNX has none."""
    if not elem_type:
        return "undefined"
    try:
        return onnx.TensorProto.DataType.Name(elem_type)
    except ValueError:
        return f"{elem_type} (not an ONNX type)"


def tensor_info(value: onnx.ValueInfoProto, where: str) -> TensorInfo:
    """The info a graph input declares; UnsupportedLayerError for a non-tensor or a type
    flowrt lacks, ModelLoadError for a negative dim."""
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


def _declared_shape(value: onnx.ValueInfoProto) -> tuple[Dim, ...] | None:
    """The shape a subgraph input or output declares (None: no tensor shape declared)."""
    if not value.type.HasField("tensor_type") or not value.type.tensor_type.HasField("shape"):
        return None
    dims = value.type.tensor_type.shape.dim
    return tuple(d.dim_value if d.HasField("dim_value") else (d.dim_param or None) for d in dims)


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


class GraphImporter:
    """The network being built from one ONNX graph, and the tensors its nodes have produced
    so far. ``outer`` is the importer of the enclosing graph (None for the main graph);
    ``path`` names the subgraph in messages ("node 'loop' body: ")."""

    def __init__(
        self, where: str, opset: int, reader: TensorReader, outer: GraphImporter | None = None, path: str = ""
    ) -> None:
        self.where, self.opset, self.reader = where, opset, reader
        self.outer, self.path = outer, path
        self.net = Network()
        self.tensors: dict[str, OutputSlot] = {}
        self.captures: list[str] = []  # outer values this subgraph reads, in first-read order
        self.known: set[str] = set(known_layer_kinds()) if outer is None else outer.known

    def add_graph(self, graph: onnx.GraphProto, inputs: list[onnx.ValueInfoProto]) -> list[str]:
        """Add ``graph``'s initializers, ``inputs`` (as Input layers: the main graph's with
        their declared infos, except those that are initializers; a subgraph's with
        placeholders), nodes and outputs; returns the names of its Output layers, in order."""
        for init in graph.initializer:
            value = self.reader.array(init, f"model {self.where}: {self.path}initializer {init.name!r}")
            self.produce(init.name, self.net.add_constant(value, name=init.name).outputs[0], "an initializer")
        for init in graph.sparse_initializer:
            name = init.values.name
            value = self.reader.sparse(init, f"model {self.where}: {self.path}sparse initializer {name!r}")
            self.produce(name, self.net.add_constant(value, name=name).outputs[0], "an initializer")
        for value in inputs:
            if self.outer is None and value.name in self.tensors:
                continue  # an initializer the main graph also lists as an input: a Constant
            info = tensor_info(value, self.where) if self.outer is None else PLACEHOLDER
            self.produce(value.name, self.net.add_input(value.name, info).outputs[0], f"{self.path}input")
        self._add_nodes(graph)
        outputs: list[str] = []
        for value in graph.output:
            if self.outer is None and value.name not in self.tensors:
                raise ModelLoadError(
                    f"model {self.where}: graph output {value.name!r} is produced by no node"
                )
            name = value.name if value.name not in outputs else f"{value.name}#{len(outputs)}"
            self.net.add_output(name, self.tensor(value.name, f"{self.path}graph output"))
            outputs.append(name)
        return outputs

    def _add_nodes(self, graph: onnx.GraphProto) -> None:
        """Add every node of ``graph``, then connect each layer's inputs (a node may read a
        tensor a later node makes only in a malformed model, which validation refuses)."""
        pending = []
        for index, node in enumerate(graph.node):
            label = node.name or f"{node.op_type}_{index}"
            try:
                added = self.add_node(node, label)
            except FlowrtError:
                raise
            except Exception as e:  # whatever a malformed node sets off is still a malformed model
                raise ModelLoadError(
                    f"model {self.where}: {self.path}node {label!r} ({node.op_type}) cannot be imported: "
                    f"{type(e).__name__}: {e}"
                ) from e
            if added is not None:
                pending.append((label, *added))
        for label, layer, names in pending:
            for name, slot in zip(names, layer.inputs):
                if name:
                    self.tensor(name, f"{self.path}node {label!r}").connect(slot)

    def tensor(self, name: str, reader: str) -> OutputSlot:
        """The slot of tensor ``name``: made here, or in a subgraph an outer value, which
        becomes a capture; ModelLoadError naming ``reader`` when no graph in scope makes it."""
        if name in self.tensors:
            return self.tensors[name]
        if self.outer is None:
            raise ModelLoadError(
                f"model {self.where}: {reader} reads tensor {name!r}, which nothing produces"
            )
        self.captures.append(name)
        self.tensors[name] = self.net.add_input(name, PLACEHOLDER).outputs[0]
        return self.tensors[name]

    def add_node(self, node: onnx.NodeProto, label: str) -> tuple[Layer, list[str]] | None:
        """Add ``node`` as a layer (its outputs recorded in ``tensors``); returns it with the
        names of the tensors its input slots read (the node's inputs, then its subgraphs'
        captures). None for a Constant node, which becomes a Constant layer."""
        where = f"{self.path}node {label!r}"
        if node.domain == CONTRIB_DOMAIN and node.op_type not in CONTRIB_KINDS:
            raise UnsupportedLayerError(
                f"op {node.domain}.{node.op_type} ({where}) is not supported by flowrt; of the"
                f" {CONTRIB_DOMAIN} domain it runs {', '.join(sorted(CONTRIB_KINDS))}"
            )
        if node.domain not in DEFAULT_DOMAINS and node.domain != CONTRIB_DOMAIN:
            raise UnsupportedLayerError(
                f"op {node.domain}.{node.op_type} ({where}) is in a domain flowrt does not support"
            )
        if node.op_type == "Constant":
            value = _constant_node_value(node, label, self.reader)
            self.produce(node.output[0], self.net.add_constant(value, name=label).outputs[0], where)
            return None
        if node.op_type not in self.known:
            raise UnsupportedLayerError(
                f"op {node.op_type} ({where}, opset {self.opset}) is not supported by flowrt"
            )
        bodies: list[Body] = []

        def read_graph(graph: onnx.GraphProto, attribute: str) -> Body:
            bodies.append(self.body(graph, attribute, f"{where} {attribute}: "))
            return bodies[-1]

        attributes = node_attributes(
            node, read_tensor=self.reader.array, where=f"model {self.where}: {where}", read_graph=read_graph
        )
        captures = list(dict.fromkeys(name for body in bodies for name in body.captures))
        if bodies:
            attributes["captures"] = tuple(captures)
        descriptor = make_descriptor(
            node.op_type, attributes, opset=self.opset, num_outputs=len(node.output), where=where
        )
        names = [*node.input, *captures]
        layer = self.net.graph.add_layer(
            node.op_type, descriptor, name=label, num_inputs=len(names), num_outputs=len(node.output)
        )
        for name, out in zip(node.output, layer.outputs):
            if name:
                self.produce(name, out, where)
        return layer, names

    def body(self, graph: onnx.GraphProto, attribute: str, path: str) -> Body:
        """``graph``, the subgraph a node of this graph holds in ``attribute``, as a Body."""
        inner = GraphImporter(self.where, self.opset, self.reader, self, f"{self.path}{path}")
        outputs = inner.add_graph(graph, list(graph.input))
        shapes = [_declared_shape(value) for value in graph.input]
        ranks = tuple(None if shape is None else len(shape) for shape in shapes)
        inputs = [value.name for value in graph.input]
        declared = tuple(_declared_shape(value) for value in graph.output)
        return Body(inner.net.graph, inputs, inner.captures, outputs, ranks, declared, attribute)

    def produce(self, name: str, slot: OutputSlot, producer: str) -> None:
        """Record that ``producer`` makes tensor ``name``: once only (ONNX graphs are in
        single-assignment form; a second producer would silently replace the first)."""
        if name in self.tensors:
            raise ModelLoadError(
                f"model {self.where}: {producer} writes tensor {name!r}, which another node or "
                "initializer already writes; each tensor has one producer"
            )
        self.tensors[name] = slot
