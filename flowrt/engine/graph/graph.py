"""The graph of layers that a Network builds and the optimizer transforms.

Layers are connected through slots, as in Arm NN: each layer has input slots and output
slots; an output slot feeds any number of input slots; an input slot has at most one source.
"""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Iterator
from typing import Any

import numpy as np

from flowrt.engine.graph.layer_kind import NoDescriptor, get_layer_kind
from flowrt.errors import DataTypeError, FlowrtError, GraphError, ShapeError, UnsupportedLayerError
from flowrt.registry.protocols import FusedActivation, WorkloadInfo
from flowrt.types import TensorInfo


class OutputSlot:
    """An output of a layer: one tensor, read by any number of input slots."""

    def __init__(self, layer: Layer, index: int) -> None:
        self.layer = layer
        self.index = index
        self.info: TensorInfo | None = None
        self.connections: list[InputSlot] = []

    def connect(self, destination: InputSlot) -> None:
        """Feed this tensor to ``destination`` (which must not have a source yet)."""
        if destination.source is not None:
            raise GraphError(
                f"input {destination.index} of layer {destination.layer.name!r} is already "
                f"connected to {destination.source}"
            )
        destination.source = self
        self.connections.append(destination)

    def disconnect(self, destination: InputSlot) -> None:
        self.connections.remove(destination)
        destination.source = None

    def set_tensor_info(self, info: TensorInfo) -> None:
        self.info = info

    def __repr__(self) -> str:
        return f"{self.layer.name}:{self.index}"


class InputSlot:
    """An input of a layer; ``source`` is the output slot feeding it (None: unconnected)."""

    def __init__(self, layer: Layer, index: int) -> None:
        self.layer = layer
        self.index = index
        self.source: OutputSlot | None = None

    def __repr__(self) -> str:
        return f"{self.layer.name}<{self.index}"


class Layer:
    """One layer: a kind, a frozen descriptor, input and output slots, and (once optimized) a backend."""

    def __init__(self, name: str, kind: str, descriptor: Any, num_inputs: int, num_outputs: int) -> None:
        self.name = name
        self.kind = kind
        self.descriptor = descriptor
        self.inputs = [InputSlot(self, i) for i in range(num_inputs)]
        self.outputs = [OutputSlot(self, i) for i in range(num_outputs)]
        self.backend: str | None = None
        # An activation fused into this layer by the optimizer; its workload applies it.
        self.activation: FusedActivation | None = None

    def ensure_inputs(self, count: int) -> None:
        """Grow the input slots to ``count`` (optional inputs a pass starts to use)."""
        while len(self.inputs) < count:
            self.inputs.append(InputSlot(self, len(self.inputs)))

    def input_slot(self, index: int) -> InputSlot:
        return self.inputs[index]

    def output_slot(self, index: int = 0) -> OutputSlot:
        return self.outputs[index]

    @property
    def input_infos(self) -> list[TensorInfo | None]:
        return [s.source.info if s.source is not None else None for s in self.inputs]

    @property
    def output_infos(self) -> list[TensorInfo | None]:
        return [s.info for s in self.outputs]

    def producers(self) -> Iterator[Layer]:
        for slot in self.inputs:
            if slot.source is not None:
                yield slot.source.layer

    def consumers(self) -> Iterator[Layer]:
        for out in self.outputs:
            for dst in out.connections:
                yield dst.layer

    def __repr__(self) -> str:
        return f"Layer({self.name!r}, {self.kind})"


class Graph:
    """A set of connected layers; keeps insertion order and unique names."""

    def __init__(self) -> None:
        self.layers: dict[str, Layer] = {}

    # -- building ---------------------------------------------------------------------------
    def unique_name(self, base: str) -> str:
        if base not in self.layers:
            return base
        for i in itertools.count(1):
            name = f"{base}_{i}"
            if name not in self.layers:
                return name
        raise AssertionError("unreachable")

    def add_layer(
        self,
        kind: str,
        descriptor: Any = None,
        name: str | None = None,
        num_inputs: int | None = None,
        num_outputs: int | None = None,
    ) -> Layer:
        """Add an unconnected layer of ``kind``; slot counts default to the kind's."""
        try:
            spec = get_layer_kind(kind)
        except KeyError:
            raise GraphError(f"unknown layer kind {kind!r}") from None
        if descriptor is None:
            descriptor = spec.descriptor()
        elif not isinstance(descriptor, spec.descriptor) and spec.descriptor is not NoDescriptor:
            raise GraphError(
                f"layer kind {kind} expects a {spec.descriptor.__name__}, got {type(descriptor).__name__}"
            )
        if num_inputs is None:
            num_inputs = spec.min_inputs
        if num_outputs is None:
            num_outputs = spec.num_outputs if spec.num_outputs is not None else 1
        layer = Layer(self.unique_name(name or kind), kind, descriptor, num_inputs, num_outputs)
        self.layers[layer.name] = layer
        return layer

    def remove_layer(self, layer: Layer) -> None:
        """Remove a layer and every connection to or from it."""
        for slot in layer.inputs:
            if slot.source is not None:
                slot.source.disconnect(slot)
        for out in layer.outputs:
            for dst in list(out.connections):
                out.disconnect(dst)
        del self.layers[layer.name]

    def remove_unread_constants(self) -> None:
        """Drop Constant layers nothing reads any more (what a folding pass leaves behind)."""
        for layer in self.of_kind("Constant"):
            if not layer.outputs[0].connections:
                self.remove_layer(layer)

    def reroute(self, old: OutputSlot, new: OutputSlot) -> None:
        """Make every reader of ``old`` read ``new`` instead."""
        for dst in list(old.connections):
            old.disconnect(dst)
            new.connect(dst)

    # -- queries ----------------------------------------------------------------------------
    def __iter__(self) -> Iterator[Layer]:
        return iter(list(self.layers.values()))

    def __len__(self) -> int:
        return len(self.layers)

    def of_kind(self, kind: str) -> list[Layer]:
        return [layer for layer in self.layers.values() if layer.kind == kind]

    @property
    def input_layers(self) -> list[Layer]:
        return self.of_kind("Input")

    @property
    def output_layers(self) -> list[Layer]:
        return self.of_kind("Output")

    def topological_order(self) -> list[Layer]:
        """Layers so that every producer comes before its consumers (stable: insertion order).

        Raises GraphError naming the layers on a cycle.
        """
        # Plain loops over the slots: every pass asks for this order, on graphs of thousands of layers.
        pending: dict[Layer, int] = {}
        ready: deque[Layer] = deque()
        for layer in self.layers.values():
            count = 0
            for slot in layer.inputs:
                if slot.source is not None:
                    count += 1
            pending[layer] = count
            if count == 0:
                ready.append(layer)
        order: list[Layer] = []
        while ready:
            layer = ready.popleft()
            order.append(layer)
            for out in layer.outputs:
                for dst in out.connections:
                    consumer = dst.layer
                    left = pending[consumer] - 1
                    pending[consumer] = left
                    if left == 0:
                        ready.append(consumer)
        if len(order) != len(self.layers):
            stuck = sorted(layer.name for layer, count in pending.items() if count > 0)
            raise GraphError(f"the graph has a cycle through layers {', '.join(stuck[:8])}")
        return order

    # -- validation and shape inference -----------------------------------------------------
    def validate(self) -> None:
        """Check connections, acyclicity and slot counts, then infer every output's shape and dtype."""
        for layer in self.layers.values():
            spec = get_layer_kind(layer.kind)
            connected = [s.source is not None for s in layer.inputs]
            if len(layer.inputs) < spec.min_inputs or any(not c for c in connected[: spec.min_inputs]):
                missing = [i for i, c in enumerate(connected[: max(spec.min_inputs, 1)]) if not c]
                raise GraphError(
                    f"layer {layer.name!r} ({layer.kind}) expects at least {spec.min_inputs} "
                    f"connected inputs; input slot(s) {missing or [len(layer.inputs)]} are not connected"
                )
            if spec.max_inputs is not None and len(layer.inputs) > spec.max_inputs:
                raise GraphError(
                    f"layer {layer.name!r} ({layer.kind}) takes at most {spec.max_inputs} inputs, "
                    f"got {len(layer.inputs)}"
                )
        self.infer_shapes()

    def infer_shapes(self) -> None:
        """Infer each output's TensorInfo in topological order."""
        for layer in self.topological_order():
            self.infer_layer(layer)

    @staticmethod
    def infer_layer(layer: Layer) -> None:
        """Infer ``layer``'s outputs' TensorInfos from its inputs' (and their constant values)."""
        if layer.kind == "Input":
            layer.outputs[0].info = layer.descriptor.info
            return
        infos = layer.input_infos
        consts = [constant_value(s.source) for s in layer.inputs]
        try:
            outs = get_layer_kind(layer.kind).infer(layer.descriptor, infos, consts)
        except (ShapeError, DataTypeError, UnsupportedLayerError) as e:
            raise type(e)(f"layer {layer.name!r} ({layer.kind}): {e}") from None
        except FlowrtError:
            raise
        except Exception as e:  # a malformed descriptor or input deep in the arithmetic
            shapes = ", ".join(str(i) for i in infos)
            raise ShapeError(
                f"layer {layer.name!r} ({layer.kind}): cannot infer outputs from inputs "
                f"[{shapes}]: {type(e).__name__}: {e}"
            ) from e
        if len(outs) < len(layer.outputs):
            raise ShapeError(
                f"layer {layer.name!r} ({layer.kind}) has {len(layer.outputs)} outputs but "
                f"produces {len(outs)}"
            )
        for slot, info in zip(layer.outputs, outs):
            slot.info = info

    # -- copying ----------------------------------------------------------------------------
    def copy(self) -> Graph:
        """A structural copy: new layers and slots, shared descriptors and constant data."""
        new = Graph()
        for layer in self.layers.values():
            twin = Layer(layer.name, layer.kind, layer.descriptor, len(layer.inputs), len(layer.outputs))
            twin.backend = layer.backend
            twin.activation = layer.activation
            for a, b in zip(layer.outputs, twin.outputs):
                b.info = a.info
            new.layers[twin.name] = twin
        for layer in self.layers.values():
            for slot in layer.inputs:
                if slot.source is not None:
                    src = new.layers[slot.source.layer.name].outputs[slot.source.index]
                    src.connect(new.layers[layer.name].inputs[slot.index])
        return new


def constant_value(slot: OutputSlot | None) -> np.ndarray | None:
    """The array an output slot always holds when its layer is a Constant, else None."""
    if slot is None or slot.layer.kind != "Constant":
        return None
    return slot.layer.descriptor.value


def workload_info(layer: Layer, fast_math: bool = False, fp16_weights: bool = False) -> WorkloadInfo:
    """What a backend's workload factory needs to build ``layer``'s workload (``fast_math``
    and ``fp16_weights``: its network's options, see ``WorkloadInfo``)."""
    return WorkloadInfo(
        layer.name,
        layer.kind,
        layer.descriptor,
        tuple(layer.input_infos),
        tuple(o.info for o in layer.outputs),  # type: ignore[misc]  # inferred outputs are never None
        tuple(constant_value(s.source) for s in layer.inputs),
        layer.activation,
        fast_math,
        fp16_weights,
    )
