"""Small QDQ models (as ``onnxruntime.quantization.quantize_static`` writes them) with random
weights, for the QDQ fold and the quantized kernels' tests."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def _scalar(name: str, value, dtype) -> onnx.TensorProto:
    return numpy_helper.from_array(np.array(value, dtype), name)


def _quantize(nodes, inits, x: str, scale: float, zero: int, out: str) -> None:
    """x -> QuantizeLinear(uint8) -> DequantizeLinear -> out."""
    inits += [_scalar(f"{out}_s", scale, np.float32), _scalar(f"{out}_z", zero, np.uint8)]
    nodes += [
        helper.make_node("QuantizeLinear", [x, f"{out}_s", f"{out}_z"], [f"{out}_q"]),
        helper.make_node("DequantizeLinear", [f"{out}_q", f"{out}_s", f"{out}_z"], [out]),
    ]


def _weights(nodes, inits, name: str, w: np.ndarray, axis: int, rng, reduce_range: bool):
    """Symmetric int8 weights per slice along ``axis``, dequantized into ``name``."""
    limit = 63 if reduce_range else 127
    moved = np.moveaxis(w, axis, 0).reshape(w.shape[axis], -1)
    scale = (np.abs(moved).max(axis=1) / limit).astype(np.float32)
    shape = [1] * w.ndim
    shape[axis] = -1
    q = np.clip(np.rint(w / scale.reshape(shape)), -limit - 1, limit).astype(np.int8)
    inits += [
        numpy_helper.from_array(q, f"{name}_q"),
        numpy_helper.from_array(scale, f"{name}_s"),
        numpy_helper.from_array(np.zeros_like(scale, np.int8), f"{name}_z"),
    ]
    nodes.append(
        helper.make_node("DequantizeLinear", [f"{name}_q", f"{name}_s", f"{name}_z"], [name], axis=axis)
    )
    return scale


def qdq_conv_model(
    rng: np.random.Generator,
    channels: int = 8,
    filters: int = 16,
    size: int = 10,
    kernel: int = 3,
    reduce_range: bool = True,
    group: int = 1,
    strides: int = 1,
    flat_zero_point: int = 120,
) -> onnx.ModelProto:
    """x (1, C, H, W) -> QDQ -> Conv (+ int32 bias) -> QDQ -> MatMul by constant weights -> QDQ -> y."""
    nodes: list = []
    inits: list = []
    _quantize(nodes, inits, "x", 0.02, 128, "xq")
    w = rng.standard_normal((filters, channels // group, kernel, kernel)).astype(np.float32) * 0.2
    w_scale = _weights(nodes, inits, "w", w, 0, rng, reduce_range)
    b = rng.standard_normal(filters).astype(np.float32)
    b_q = np.rint(b / (0.02 * w_scale)).astype(np.int32)
    inits += [
        numpy_helper.from_array(b_q, "b_q"),
        numpy_helper.from_array((np.float32(0.02) * w_scale).astype(np.float32), "b_s"),
        numpy_helper.from_array(np.zeros(filters, np.int32), "b_z"),
    ]
    nodes.append(helper.make_node("DequantizeLinear", ["b_q", "b_s", "b_z"], ["b"], axis=0))
    pad = kernel // 2
    nodes.append(
        helper.make_node(
            "Conv", ["xq", "w", "b"], ["c"], pads=[pad] * 4, group=group, strides=[strides] * 2, name="conv"
        )
    )
    _quantize(nodes, inits, "c", 0.05, 120, "cq")
    out = (size + 2 * pad - kernel) // strides + 1
    nodes.append(helper.make_node("Reshape", ["cq", "shape"], ["flat"]))
    inits.append(numpy_helper.from_array(np.array([filters, out * out], np.int64), "shape"))
    _quantize(nodes, inits, "flat", 0.05, flat_zero_point, "flatq")
    m = rng.standard_normal((out * out, 12)).astype(np.float32) * 0.1
    _weights(nodes, inits, "m", m, 1, rng, reduce_range)
    nodes.append(helper.make_node("MatMul", ["flatq", "m"], ["mm"], name="matmul"))
    _quantize(nodes, inits, "mm", 0.03, 100, "y")
    graph = helper.make_graph(
        nodes,
        "qdq",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, channels, size, size])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [filters, 12])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def qdq_gemm_model(
    rng: np.random.Generator,
    rows: int = 3,
    reduction: int = 40,
    columns: int = 24,
    trans_b: int = 1,
    bias: bool = True,
) -> onnx.ModelProto:
    """x (rows, K) -> QDQ -> Gemm by int8 weights per column (+ int32 bias, unless ``bias`` is
    False) -> QDQ -> y: a classifier as quantize_static writes it."""
    nodes: list = []
    inits: list = []
    _quantize(nodes, inits, "x", 0.02, 128, "xq")
    shape = (columns, reduction) if trans_b else (reduction, columns)
    w = rng.standard_normal(shape).astype(np.float32) * 0.2
    w_scale = _weights(nodes, inits, "w", w, 0 if trans_b else 1, rng, True)
    if bias:
        b_q = np.rint(rng.standard_normal(columns) / (0.02 * w_scale)).astype(np.int32)
        inits += [
            numpy_helper.from_array(b_q, "b_q"),
            numpy_helper.from_array((np.float32(0.02) * w_scale).astype(np.float32), "b_s"),
            numpy_helper.from_array(np.zeros(columns, np.int32), "b_z"),
        ]
        nodes.append(helper.make_node("DequantizeLinear", ["b_q", "b_s", "b_z"], ["b"], axis=0))
    operands = ["xq", "w", "b"] if bias else ["xq", "w"]
    nodes.append(helper.make_node("Gemm", operands, ["g"], transB=trans_b, name="gemm"))
    _quantize(nodes, inits, "g", 0.05, 120, "y")
    graph = helper.make_graph(
        nodes,
        "qdq_gemm",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [rows, reduction])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [rows, columns])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model
