"""From an ONNX node's attributes to a layer descriptor.

The rule every layer kind follows: the kind is the ONNX op type; its descriptor's fields are
the op's attribute names (from every opset, legacy ones included); a descriptor with a field
``opset`` receives the model's opset version; one with a field ``num_outputs`` that the node
does not set receives the node's output count. An attribute the descriptor does not declare
is refused rather than ignored, because ignoring it could change the result silently. A graph
attribute (If's branches, Loop's and Scan's body) is a ``Body`` the importer makes, and the
descriptor of such a node receives ``captures``: the outer values its bodies read (see
``graph_importer.py``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import attrs
import onnx
from onnx import numpy_helper

from flowrt.engine.graph.layer_kind import get_layer_kind
from flowrt.errors import ModelLoadError, UnsupportedLayerError


def _text(value: bytes, attr: onnx.AttributeProto, where: str) -> str:
    try:
        return value.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ModelLoadError(
            f"{where}: attribute {attr.name!r} must be UTF-8 text, found the bytes {value[:40]!r}"
        ) from e


def _plain_tensor(tensor: onnx.TensorProto, where: str) -> Any:
    return numpy_helper.to_array(tensor)


def attribute_value(
    attr: onnx.AttributeProto,
    *,
    read_tensor: Callable[[onnx.TensorProto, str], Any] = _plain_tensor,
    where: str = "",
    read_graph: Callable[[onnx.GraphProto, str], Any] | None = None,
) -> Any:
    """The Python value of an attribute: int, float, str, tuple of those, or a numpy array.

    ``read_tensor(tensor, what)`` makes a tensor attribute's array (the importer's checks it
    against its dims and the memory budget); ``read_graph(graph, attribute name)`` makes a
    graph attribute's value (the importer's makes a subgraph body; without one a graph is
    refused); ``where`` names the node for messages.
    """
    kind = attr.type
    A = onnx.AttributeProto
    if kind == A.INT:
        return int(attr.i)
    if kind == A.FLOAT:
        return float(attr.f)
    if kind == A.STRING:
        return _text(attr.s, attr, where)
    if kind == A.INTS:
        return tuple(int(v) for v in attr.ints)
    if kind == A.FLOATS:
        return tuple(float(v) for v in attr.floats)
    if kind == A.STRINGS:
        return tuple(_text(v, attr, where) for v in attr.strings)
    if kind == A.TENSOR:
        return read_tensor(attr.t, f"{where}: attribute {attr.name!r}")
    if kind == A.GRAPH and read_graph is not None:
        return read_graph(attr.g, attr.name)
    raise UnsupportedLayerError(
        f"attribute {attr.name!r} has type {A.AttributeType.Name(kind)}, which flowrt does not support"
    )


def make_descriptor(
    kind_name: str, attributes: dict[str, Any], *, opset: int, num_outputs: int, where: str = ""
) -> Any:
    """Build the descriptor of ``kind_name`` from attribute values, following the rule above."""
    spec = get_layer_kind(kind_name)
    fields = {f.name for f in attrs.fields(spec.descriptor)} if attrs.has(spec.descriptor) else set()
    unknown = sorted(set(attributes) - fields)
    if unknown:
        raise UnsupportedLayerError(
            f"{where}: {kind_name} (opset {opset}) attribute(s) {', '.join(unknown)} are not supported"
        )
    values = dict(attributes)
    if "opset" in fields:
        values["opset"] = opset
    if "num_outputs" in fields and "num_outputs" not in values:
        values["num_outputs"] = num_outputs
    try:
        return spec.descriptor(**values)
    except (TypeError, ValueError) as e:
        raise ModelLoadError(f"{where}: invalid attributes for {kind_name}: {e}") from e


def node_attributes(
    node: onnx.NodeProto,
    *,
    read_tensor: Callable[[onnx.TensorProto, str], Any] = _plain_tensor,
    where: str = "",
    read_graph: Callable[[onnx.GraphProto, str], Any] | None = None,
) -> dict[str, Any]:
    """``{name: value}`` of the node's attributes (see :func:`attribute_value`)."""
    return {
        a.name: attribute_value(a, read_tensor=read_tensor, where=where, read_graph=read_graph)
        for a in node.attribute
    }
