"""RNN, GRU and LSTM cases shared by the CpuRef and CpuAcc tests: random layers drawn by
hypothesis, and one-node ONNX models of them run by onnxruntime."""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
from hypothesis import strategies as st
from onnx import TensorProto, helper

INPUT_NAMES = ("X", "W", "R", "B", "sequence_lens", "initial_h", "initial_c", "P")
OUTPUT_NAMES = ("Y", "Y_h", "Y_c")
GATES = {"RNN": 1, "GRU": 3, "LSTM": 4}
PER_DIRECTION = {"RNN": 1, "GRU": 2, "LSTM": 3}
ACTIVATIONS = (
    "Sigmoid", "Tanh", "Relu", "HardSigmoid", "Affine", "LeakyRelu", "ThresholdedRelu", "ScaledTanh", "Elu",
    "Softsign", "Softplus",
)  # fmt: skip


def layer_inputs(
    op: str, seq: int, batch: int, size: int, hidden: int, *, direction: str = "forward", layout: int = 0,
    optional: tuple[bool, ...] = (True, False, True, True, True), lengths=None, seed: int = 0,
    scale: float = 0.5,
) -> list[np.ndarray | None]:  # fmt: skip
    """X, W, R and the optional inputs (B, sequence_lens, initial_h, initial_c, P: those
    ``optional`` marks, sequence_lens when ``lengths`` is given), random normal times ``scale``;
    trailing absent ones left off."""
    rng = np.random.default_rng(seed)
    dirs, rows = 2 if direction == "bidirectional" else 1, GATES[op] * hidden

    def normal(*shape):
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    state = (batch, dirs, hidden) if layout else (dirs, batch, hidden)
    x = normal(batch, seq, size) if layout else normal(seq, batch, size)
    lens = None if lengths is None else np.asarray(lengths, np.int32)
    inputs = [
        x,
        normal(dirs, rows, size),
        normal(dirs, rows, hidden),
        normal(dirs, 2 * rows),
        lens,
        normal(*state),
    ]
    if op == "LSTM":
        inputs += [normal(*state), normal(dirs, 3 * hidden)]
    given = (True, True, True, *optional[:1], lens is not None, *optional[2:])
    inputs = [a if present else None for a, present in zip(inputs, given)]
    while inputs[-1] is None:
        inputs.pop()
    return inputs


@st.composite
def layer_cases(draw, op: str | None = None, layouts=(0, 1), max_outputs: bool = False) -> tuple:
    """``(op, inputs, attributes, num_outputs)``: a random layer (attributes as onnx.helper
    takes them), its weights small enough that unbounded activations stay finite."""
    op = op or draw(st.sampled_from(sorted(GATES)))
    seq, batch, size, hidden = (
        draw(st.integers(1, 5)),
        draw(st.integers(1, 3)),
        draw(st.integers(1, 5)),
        draw(st.integers(1, 6)),
    )
    direction = draw(st.sampled_from(["forward", "reverse", "bidirectional"]))
    layout = draw(st.sampled_from(layouts))
    optional = tuple(draw(st.lists(st.booleans(), min_size=5, max_size=5)))  # [1]: sequence_lens
    lengths = draw(st.lists(st.integers(0, seq), min_size=batch, max_size=batch)) if optional[1] else None
    inputs = layer_inputs(
        op, seq, batch, size, hidden, direction=direction, layout=layout, optional=optional, lengths=lengths,
        seed=draw(st.integers(0, 2**16)), scale=0.4,
    )  # fmt: skip
    attributes: dict[str, Any] = {"direction": direction, "layout": layout}
    if draw(st.booleans()):
        attributes["hidden_size"] = hidden
    if draw(st.booleans()):
        count = PER_DIRECTION[op] * (2 if direction == "bidirectional" else 1)
        attributes["activations"] = draw(
            st.lists(st.sampled_from(ACTIVATIONS), min_size=count, max_size=count)
        )
        # one value per activation, taken in order by those that use them (a value for each,
        # so that no default is read: onnxruntime's differ from the spec's for some)
        attributes["activation_alpha"] = draw(st.lists(st.floats(0.1, 1.5), min_size=count, max_size=count))
        attributes["activation_beta"] = draw(st.lists(st.floats(0.1, 1.5), min_size=count, max_size=count))
    if draw(st.booleans()):
        attributes["clip"] = draw(st.floats(0.1, 3.0))
    if op == "LSTM":
        attributes["input_forget"] = int(draw(st.booleans()))
    if op == "GRU":
        attributes["linear_before_reset"] = int(draw(st.booleans()))
    most = 3 if op == "LSTM" else 2
    num_outputs = most if max_outputs else draw(st.integers(1, most))
    return op, inputs, attributes, num_outputs


def node_model(
    op: str, inputs, attributes: dict, num_outputs: int, *, constants=(), output_names=None, opset: int = 22
) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """A one-node model of the layer and its feeds; inputs whose index is in ``constants`` are
    initializers, absent ones empty names."""
    names = [name if a is not None else "" for name, a in zip(INPUT_NAMES, inputs)]
    outputs = list(output_names or OUTPUT_NAMES[:num_outputs])
    node = helper.make_node(op, names, outputs, **attributes)

    def info(name, a):
        return helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(a.dtype), a.shape)

    graph_inputs = [info(n, a) for i, (n, a) in enumerate(zip(names, inputs)) if n and i not in constants]
    initializers = [
        onnx.numpy_helper.from_array(a, n)
        for i, (n, a) in enumerate(zip(names, inputs))
        if n and i in constants
    ]
    x, hidden, layout = inputs[0].shape, inputs[2].shape[2], attributes.get("layout", 0)
    dirs = 2 if attributes.get("direction") == "bidirectional" else 1
    seq, batch = (x[1], x[0]) if layout else (x[0], x[1])
    state = [batch, dirs, hidden] if layout else [dirs, batch, hidden]
    shapes = [[batch, seq, dirs, hidden] if layout else [seq, dirs, batch, hidden], state, state]
    graph_outputs = [
        helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in zip(outputs, shapes) if n
    ]
    graph = helper.make_graph([node], op.lower(), graph_inputs, graph_outputs, initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 10
    feeds = {n: a for i, (n, a) in enumerate(zip(names, inputs)) if n and i not in constants}
    return model, feeds


def run_onnxruntime(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    """The model's outputs from onnxruntime's CPU provider."""
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, feeds)
