"""Network: the graph a user builds in Python or a front end imports (Arm NN's INetwork).

Layers are added unconnected and connected through slots, as in Arm NN::

    net = Network()
    x = net.add_input("x", TensorInfo((1, 3, 32, 32)))
    conv = net.add_convolution2d(descriptors.Conv(pads=(1, 1, 1, 1)), weights, bias, name="conv1")
    x.output_slot(0).connect(conv.input_slot(0))
    relu = net.add_activation("Relu")
    conv.output_slot(0).connect(relu.input_slot(0))
    net.add_output("y", relu)

Any layer kind can be added with :meth:`Network.add_layer`, which also takes its inputs.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from flowrt.engine.graph.graph import Graph, Layer, OutputSlot
from flowrt.engine.graph.layer_kind import get_layer_kind
from flowrt.engine.graph.layers.io import ConstantDescriptor, InputDescriptor, OutputDescriptor
from flowrt.errors import GraphError
from flowrt.types import TensorInfo

Source = OutputSlot | Layer | np.ndarray | None


class Network:
    """A graph of layers under construction; ``validate()`` checks it and infers shapes."""

    def __init__(self) -> None:
        self.graph = Graph()

    # -- generic ----------------------------------------------------------------------------
    def add_layer(
        self,
        kind: str,
        descriptor: Any = None,
        inputs: Sequence[Source] = (),
        *,
        name: str | None = None,
        num_inputs: int | None = None,
        num_outputs: int | None = None,
    ) -> Layer:
        """Add a layer of any registered kind, connecting ``inputs`` to its first input slots.

        An input may be an output slot, a layer (its first output), an array (made a Constant
        layer) or None (an absent optional input).
        """
        try:
            spec = get_layer_kind(kind)
        except KeyError:
            raise GraphError(f"unknown layer kind {kind!r}") from None
        count = max(num_inputs or 0, len(inputs), spec.min_inputs)
        layer = self.graph.add_layer(kind, descriptor, name, num_inputs=count, num_outputs=num_outputs)
        for slot, source in zip(layer.inputs, inputs):
            out = self._source(source, f"{layer.name}/input{slot.index}")
            if out is not None:
                out.connect(slot)
        return layer

    def _source(self, source: Source, constant_name: str) -> OutputSlot | None:
        if source is None or isinstance(source, OutputSlot):
            return source
        if isinstance(source, Layer):
            if not source.outputs:
                raise GraphError(f"layer {source.name!r} has no outputs to connect")
            return source.outputs[0]
        return self.add_constant(np.asarray(source), name=constant_name).outputs[0]

    # -- data layers ------------------------------------------------------------------------
    def add_input(self, name: str, info: TensorInfo) -> Layer:
        """A network input called ``name``; feeds must match ``info`` (symbolic dims take any size)."""
        if any(layer.descriptor.name == name for layer in self.graph.input_layers):
            raise GraphError(f"the network already has an input called {name!r}")
        return self.graph.add_layer("Input", InputDescriptor(name, info), name=name)

    def add_output(self, name: str, source: Source = None) -> Layer:
        """A network output called ``name``, optionally connected to ``source`` now."""
        if any(layer.descriptor.name == name for layer in self.graph.output_layers):
            raise GraphError(f"the network already has an output called {name!r}")
        return self.add_layer(
            "Output", OutputDescriptor(name), [source] if source is not None else [], name=name
        )

    def add_constant(self, value: np.ndarray, name: str | None = None) -> Layer:
        """A constant tensor (weights, biases); the array is kept read-only."""
        return self.graph.add_layer("Constant", ConstantDescriptor(value), name=name or "constant")

    # -- Arm NN-style conveniences ----------------------------------------------------------
    def add_convolution2d(
        self, descriptor: Any, weights: np.ndarray, bias: np.ndarray | None = None, name: str | None = None
    ) -> Layer:
        """A Conv layer (descriptor: ``flowrt.descriptors.Conv``); connect its input slot 0."""
        return self.add_layer("Conv", descriptor, [None, weights, bias], name=name)

    def add_fully_connected(
        self, weights: np.ndarray, bias: np.ndarray | None = None, name: str | None = None
    ) -> Layer:
        """y = x @ weights.T + bias, with weights of shape (out_features, in_features)."""
        desc = get_layer_kind("Gemm").descriptor(transB=1)
        return self.add_layer("Gemm", desc, [None, weights, bias], name=name)

    def add_activation(self, function: str, descriptor: Any = None, name: str | None = None) -> Layer:
        """An activation layer: ``function`` is its kind, e.g. "Relu", "Sigmoid", "LeakyRelu"."""
        return self.add_layer(function, descriptor, [None], name=name)

    def add_pooling2d(self, kind: str, descriptor: Any, name: str | None = None) -> Layer:
        """A pooling layer of ``kind`` "MaxPool", "AveragePool", "GlobalAveragePool" or "GlobalMaxPool"."""
        return self.add_layer(kind, descriptor, [None], name=name)

    def add_elementwise(self, kind: str, name: str | None = None) -> Layer:
        """A binary layer ("Add", "Sub", "Mul", "Div", ...); connect input slots 0 and 1."""
        return self.add_layer(kind, None, [None, None], name=name)

    def add_softmax(self, descriptor: Any = None, name: str | None = None) -> Layer:
        return self.add_layer("Softmax", descriptor, [None], name=name)

    def add_concat(self, descriptor: Any, num_inputs: int, name: str | None = None) -> Layer:
        return self.add_layer("Concat", descriptor, [None] * num_inputs, name=name)

    def add_reshape(self, shape: Sequence[int], name: str | None = None) -> Layer:
        return self.add_layer("Reshape", None, [None, np.asarray(shape, dtype=np.int64)], name=name)

    # -- checks -----------------------------------------------------------------------------
    def validate(self) -> None:
        """Check connections and acyclicity and infer every output's shape and dtype."""
        self.graph.validate()

    @property
    def inputs(self) -> dict[str, TensorInfo]:
        return {layer.descriptor.name: layer.descriptor.info for layer in self.graph.input_layers}

    @property
    def output_names(self) -> list[str]:
        return [layer.descriptor.name for layer in self.graph.output_layers]

    def __len__(self) -> int:
        return len(self.graph)
