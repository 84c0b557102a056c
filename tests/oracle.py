"""Run one operator through flowrt's CpuRef unit and through onnx's reference evaluator."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import onnx
from onnx import helper
from onnx.reference import ReferenceEvaluator

from flowrt.engine.graph.layer_kind import get_layer_kind
from flowrt.frontends.onnx.descriptors import make_descriptor
from flowrt.types import TensorInfo
from flowrt.workers.cpu.ref.kernels import load_all

LATEST_OPSET = 21


def run_onnx_reference(
    op_type: str,
    inputs: Sequence[np.ndarray | None],
    attributes: dict[str, Any] | None = None,
    *,
    opset: int = LATEST_OPSET,
    num_outputs: int = 1,
) -> list[np.ndarray]:
    """Outputs of one node evaluated by onnx.reference.ReferenceEvaluator."""
    in_names = [f"x{i}" if x is not None else "" for i, x in enumerate(inputs)]
    out_names = [f"y{i}" for i in range(num_outputs)]
    node = helper.make_node(op_type, in_names, out_names, **(attributes or {}))
    graph_inputs = [
        helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(x.dtype), x.shape)
        for n, x in zip(in_names, inputs)
        if x is not None
    ]
    graph_outputs = [helper.make_tensor_value_info(n, onnx.TensorProto.UNDEFINED, None) for n in out_names]
    graph = helper.make_graph([node], "one_node", graph_inputs, graph_outputs)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    feeds = {n: x for n, x in zip(in_names, inputs) if x is not None}
    return list(ReferenceEvaluator(model).run(None, feeds))


def run_flowrt_node(
    op_type: str,
    inputs: Sequence[np.ndarray | None],
    attributes: dict[str, Any] | None = None,
    *,
    opset: int = LATEST_OPSET,
    num_outputs: int = 1,
    constant_inputs: Sequence[int] | None = None,
) -> tuple[list[np.ndarray], list[TensorInfo]]:
    """Outputs of flowrt's CpuRef kernel for one op, and the infos its shape inference gives.

    Attributes are given as onnx.helper.make_node takes them; they reach the descriptor by the
    front end's rule. ``constant_inputs`` lists the input indices shape inference sees as
    constants (default: all of them).
    """
    node = helper.make_node(
        op_type,
        [f"x{i}" for i in range(len(inputs))],
        [f"y{i}" for i in range(num_outputs)],
        **(attributes or {}),
    )
    from flowrt.frontends.onnx.descriptors import node_attributes

    desc = make_descriptor(
        op_type, node_attributes(node), opset=opset, num_outputs=num_outputs, where=op_type
    )
    const_idx = set(range(len(inputs)) if constant_inputs is None else constant_inputs)
    infos = [TensorInfo.of(x) if x is not None else None for x in inputs]
    consts = [x if (i in const_idx and x is not None) else None for i, x in enumerate(inputs)]
    inferred = get_layer_kind(op_type).infer(desc, infos, consts)[:num_outputs]
    result = load_all()[op_type](desc, *inputs)
    outputs = list(result) if isinstance(result, (tuple, list)) else [result]
    return [np.asarray(o) for o in outputs[:num_outputs]], inferred


def assert_matches_reference(
    op_type: str,
    inputs: Sequence[np.ndarray | None],
    attributes: dict[str, Any] | None = None,
    *,
    opset: int = LATEST_OPSET,
    num_outputs: int = 1,
    rtol: float = 1e-5,
    atol: float = 1e-6,
) -> list[np.ndarray]:
    """Assert flowrt's kernel and inferred infos agree with onnx's reference evaluator."""
    expected = run_onnx_reference(op_type, inputs, attributes, opset=opset, num_outputs=num_outputs)
    got, infos = run_flowrt_node(op_type, inputs, attributes, opset=opset, num_outputs=num_outputs)
    assert len(got) == len(expected)
    for g, e, info in zip(got, expected, infos):
        e = np.asarray(e)
        assert g.dtype == e.dtype, f"{op_type}: dtype {g.dtype} != reference {e.dtype}"
        assert g.shape == e.shape, f"{op_type}: shape {g.shape} != reference {e.shape}"
        np.testing.assert_allclose(g, e, rtol=rtol, atol=atol)
        assert info.dtype.numpy == e.dtype, f"{op_type}: inferred dtype {info.dtype} != {e.dtype}"
        assert info.shape is None or len(info.shape) == e.ndim
        if info.shape is not None:
            for d, n in zip(info.shape, e.shape):
                assert d is None or isinstance(d, str) or d == n, (
                    f"{op_type}: inferred {info.shape} vs {e.shape}"
                )
    return got
