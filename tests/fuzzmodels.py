"""Seeded mutations of a small ONNX model, for the fuzz tests (``fuzzflowrt`` has the .flowrt ones).

Each ``mutate_*`` takes the original bytes and a ``numpy.random.Generator`` and returns the
mutated bytes and a short description of what was done (for failure messages). Mutations are
byte-level (flips, cuts, insertions: what a damaged download gives; shared by both formats)
and structural (the file parsed, one to three fields changed, written again: what a buggy
exporter or a hand edit gives).
"""

from __future__ import annotations

import copy
from collections.abc import Callable

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from flowrt.engine.graph.layer_kind import known_layer_kinds

Mutation = tuple[bytes, str]
HUGE_DIMS = (0, 1, 7, -1, -(2**40), 2**31, 2**40, 2**62, 2**63 - 1)
STRANGE_TEXT = ("", "Relu", "x", "no such op", "\u00e9\u4e2d\U0001f600", "a" * 300, "y/folded0", "..")


# -- the originals --------------------------------------------------------------------------------
def small_onnx_model() -> onnx.ModelProto:
    """x (1, 3, 8, 8) -> Conv+bias -> Relu -> MaxPool -> Reshape -> MatMul -> Add -> Clip ->
    Softmax, with a Shape/ConstantOfShape/Expand branch, a Constant node and a Concat: a few
    of every kind of field a mutation can hit."""
    rng = np.random.default_rng(0)

    def init(name, array):
        return numpy_helper.from_array(np.asarray(array), name)

    inits = [
        init("w", rng.standard_normal((4, 3, 3, 3)).astype(np.float32)),
        init("b", rng.standard_normal(4).astype(np.float32)),
        init("shape", np.array([1, -1], np.int64)),
        init("fc", rng.standard_normal((64, 5)).astype(np.float32)),
        init("lo", np.array(-2.0, np.float32)),
        init("hi", np.array(2.0, np.float32)),
        init("ones_shape", np.array([1, 5], np.int64)),
    ]
    nodes = [
        helper.make_node("Conv", ["x", "w", "b"], ["c"], name="conv", pads=[1, 1, 1, 1], strides=[1, 1]),
        helper.make_node("Relu", ["c"], ["r"], name="relu"),
        helper.make_node("MaxPool", ["r"], ["p"], name="pool", kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("Reshape", ["p", "shape"], ["flat"], name="reshape"),
        helper.make_node("MatMul", ["flat", "fc"], ["mm"], name="matmul"),
        helper.make_node(
            "ConstantOfShape",
            ["ones_shape"],
            ["ones"],
            name="cos",
            value=numpy_helper.from_array(np.array([0.5], np.float32)),
        ),
        helper.make_node(
            "Constant", [], ["k"], name="k", value=init("kv", np.full((1, 5), 0.25, np.float32))
        ),
        helper.make_node("Add", ["mm", "ones"], ["a"], name="add"),
        helper.make_node("Mul", ["a", "k"], ["m"], name="mul"),
        helper.make_node("Clip", ["m", "lo", "hi"], ["cl"], name="clip"),
        helper.make_node("Softmax", ["cl"], ["y"], name="softmax", axis=-1),
        helper.make_node("Shape", ["flat"], ["s"], name="shape_of"),
        helper.make_node("Concat", ["s", "s"], ["ss"], name="concat", axis=0),
    ]
    graph = helper.make_graph(
        nodes,
        "small",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
        [
            helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 5]),
            helper.make_tensor_value_info("ss", TensorProto.INT64, [4]),
        ],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


# -- byte-level mutations, for either format ---------------------------------------------------------
def _flip(data: bytes, rng: np.random.Generator) -> Mutation:
    out = bytearray(data)
    count = int(rng.integers(1, 9))
    for at in rng.integers(0, len(out), count):
        out[at] = int(rng.integers(0, 256))
    return bytes(out), f"{count} random bytes"


def _cut(data: bytes, rng: np.random.Generator) -> Mutation:
    at = int(rng.integers(0, len(data)))
    return data[:at], f"truncated at {at}"


def _insert(data: bytes, rng: np.random.Generator) -> Mutation:
    at, size = int(rng.integers(0, len(data))), int(rng.integers(1, 64))
    return data[:at] + rng.bytes(size) + data[at:], f"{size} bytes inserted at {at}"


def _drop(data: bytes, rng: np.random.Generator) -> Mutation:
    at, size = int(rng.integers(0, len(data))), int(rng.integers(1, 64))
    return data[:at] + data[at + size :], f"{size} bytes dropped at {at}"


def _not_utf8(data: bytes, rng: np.random.Generator) -> Mutation:
    """A name or op type made invalid UTF-8 in place (same length, so the protobuf still parses)."""
    words = [w for w in (b"conv", b"Relu", b"relu", b"MatMul", b"shape", b"softmax", b"Clip") if w in data]
    word = words[int(rng.integers(0, len(words)))]
    return data.replace(word, b"\xff\xfe" + word[2:], 1), f"{word!r} made invalid UTF-8"


BYTE_MUTATIONS = (_flip, _cut, _insert, _drop)


# -- ONNX: structural mutations ------------------------------------------------------------------------
def pick(rng: np.random.Generator, items):
    return items[int(rng.integers(0, len(items)))]


def _node_op(model: onnx.ModelProto, rng: np.random.Generator) -> str:
    node = pick(rng, model.graph.node)
    node.op_type = pick(rng, [*known_layer_kinds(), "Constant", "NoSuchOp", ""])
    return f"node {node.name!r} op_type -> {node.op_type}"


def _names(model: onnx.ModelProto, rng: np.random.Generator) -> str:
    node = pick(rng, model.graph.node)
    field = pick(rng, ("name", "input", "output"))
    new = pick(rng, [*STRANGE_TEXT, *(n.name for n in model.graph.node)])
    if field == "name" or not getattr(node, field):
        node.name = new
    else:
        getattr(node, field)[int(rng.integers(0, len(getattr(node, field))))] = new
    return f"node {node.name!r} {field} -> {new!r}"


def _dims(model: onnx.ModelProto, rng: np.random.Generator) -> str:
    if rng.random() < 0.5:
        tensor = pick(rng, model.graph.initializer)
        dims = list(tensor.dims) or [1]
        dims[int(rng.integers(0, len(dims)))] = pick(rng, HUGE_DIMS)
        if rng.random() < 0.3:
            dims.append(pick(rng, HUGE_DIMS))
        del tensor.dims[:]
        tensor.dims.extend(dims)
        return f"initializer {tensor.name!r} dims -> {dims}"
    dim = pick(rng, model.graph.input[0].type.tensor_type.shape.dim)
    dim.dim_value = pick(rng, HUGE_DIMS)
    return f"input dim -> {dim.dim_value}"


def _values(model: onnx.ModelProto, rng: np.random.Generator) -> str:
    """A shape-like initializer (Reshape's shape, ConstantOfShape's) gets absurd values."""
    tensor = pick(rng, [t for t in model.graph.initializer if t.data_type == TensorProto.INT64])
    values = rng.choice(HUGE_DIMS, size=int(rng.integers(1, 4))).astype(np.int64)
    tensor.CopyFrom(numpy_helper.from_array(values, tensor.name))
    return f"initializer {tensor.name!r} values -> {values.tolist()}"


def _raw_data(model: onnx.ModelProto, rng: np.random.Generator) -> str:
    tensor = pick(rng, model.graph.initializer)
    raw = tensor.raw_data
    size = int(rng.integers(0, 2 * len(raw) + 2))
    tensor.raw_data = raw[:size] if size <= len(raw) else raw + rng.bytes(size - len(raw))
    if rng.random() < 0.3:
        tensor.data_type = int(rng.integers(0, 26))
    return f"initializer {tensor.name!r}: {size} raw bytes, type {tensor.data_type}"


def _attribute(model: onnx.ModelProto, rng: np.random.Generator) -> str:
    node = pick(rng, [n for n in model.graph.node if n.attribute])
    attr = pick(rng, node.attribute)
    if attr.type == onnx.AttributeProto.INTS:
        values = rng.choice(HUGE_DIMS, size=int(rng.integers(0, 5))).tolist()
        del attr.ints[:]
        attr.ints.extend(values)
        return f"node {node.name!r} {attr.name} -> {values}"
    if attr.type == onnx.AttributeProto.INT:
        attr.i = int(pick(rng, HUGE_DIMS))
        return f"node {node.name!r} {attr.name} -> {attr.i}"
    if rng.random() < 0.5:
        attr.name = pick(rng, ("axis", "alpha", "unknown_attribute", "kernel_shape", "pads"))
        return f"node {node.name!r} attribute renamed {attr.name}"
    node.attribute.remove(attr)
    return f"node {node.name!r} attribute {attr.name} removed"


def _structure(model: onnx.ModelProto, rng: np.random.Generator) -> str:
    nodes = list(model.graph.node)
    choice = int(rng.integers(0, 4))
    if choice == 0:
        gone = nodes.pop(int(rng.integers(0, len(nodes))))
        what = f"node {gone.name!r} removed"
    elif choice == 1:
        nodes.append(copy.deepcopy(pick(rng, nodes)))
        what = f"node {nodes[-1].name!r} duplicated"
    elif choice == 2:
        rng.shuffle(nodes)
        what = "nodes shuffled"
    else:
        model.opset_import[0].version = int(rng.integers(1, 30))
        return f"opset -> {model.opset_import[0].version}"
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    return what


ONNX_MUTATIONS: tuple[Callable[[onnx.ModelProto, np.random.Generator], str], ...] = (
    _node_op,
    _names,
    _dims,
    _values,
    _raw_data,
    _attribute,
    _structure,
)


def mutate_onnx(original: bytes, rng: np.random.Generator) -> Mutation:
    """A structural mutation two times in three (one to three fields), else a byte-level one."""
    roll = rng.random()
    if roll < 1 / 3:
        if rng.random() < 0.25:
            return _not_utf8(original, rng)
        return pick(rng, BYTE_MUTATIONS)(original, rng)
    model = onnx.ModelProto()
    model.ParseFromString(original)
    done = [pick(rng, ONNX_MUTATIONS)(model, rng) for _ in range(int(rng.integers(1, 4)))]
    return model.SerializeToString(), "; ".join(done)
