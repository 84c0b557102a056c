"""Small networks built with the Python API, shared by tests."""

from __future__ import annotations

import numpy as np

import flowrt
from flowrt.types import TensorInfo


def branchy_network() -> flowrt.Network:
    """x -> Relu -> (Sigmoid, Tanh) -> Add -> y: two branches that can run concurrently."""
    net = flowrt.Network()
    x = net.add_input("x", TensorInfo(("N", 4)))
    relu = net.add_layer("Relu", inputs=[x], name="relu")
    left = net.add_layer("Sigmoid", inputs=[relu], name="left")
    right = net.add_layer("Tanh", inputs=[relu], name="right")
    add = net.add_layer("Add", inputs=[left, right], name="add")
    net.add_output("y", add)
    return net


def branchy_expected(x: np.ndarray) -> np.ndarray:
    r = np.maximum(x, 0)
    return 1 / (1 + np.exp(-r)) + np.tanh(r)


def serializable_network() -> flowrt.Network:
    """Conv, pooling, Gemm and friends on a symbolic batch, two outputs, a few KiB of weights."""
    d = flowrt.descriptors
    rng = np.random.default_rng(0)
    weights = [rng.standard_normal(s).astype(np.float32) for s in ((3, 2, 3, 3), (3,), (4, 27), (4,))]
    net = flowrt.Network()
    x = net.add_input("x", TensorInfo(("N", 2, 6, 6)))
    conv = net.add_layer("Conv", d.Conv(pads=(1, 1, 1, 1)), inputs=[x, *weights[:2]], name="conv")
    relu = net.add_layer("Relu", inputs=[conv], name="relu")
    pool = net.add_layer("MaxPool", d.MaxPool(kernel_shape=(2, 2), strides=(2, 2)), inputs=[relu])
    flat = net.add_layer("Flatten", inputs=[pool], name="flat")
    gemm = net.add_layer("Gemm", d.Gemm(transB=1), inputs=[flat, *weights[2:]], name="gemm")
    clip = net.add_layer("Clip", d.Clip(min=-1.0), inputs=[gemm], name="clip")
    soft = net.add_layer("Softmax", inputs=[clip], name="softmax")
    net.add_output("probs", soft)
    net.add_output("features", pool)
    return net
