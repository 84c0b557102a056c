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
