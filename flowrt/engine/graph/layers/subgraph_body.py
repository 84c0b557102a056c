"""Body: a graph that a control-flow layer (If, Loop, Scan) runs, and the shape inference
those layers share.

A body's Input layers are its formal inputs (a Loop's iteration number, condition and
carried values; a Scan's states and scan slices; an If branch has none), then its
*captures*: the values of enclosing graphs it reads by name (ONNX's outer-scope references),
each an Input layer called by the outer value's name. Its layer takes the captures as extra
inputs after its own (the ``captures`` of its descriptor), so the enclosing graph sees every
value the body reads, and orders and frees them as any other input.

The infos of a body's Input layers are placeholders: :meth:`Body.specialize` copies the graph
with the infos of one use (from its layer's input infos), which shape inference and a
backend's load work from. A body is never changed once made; descriptors that share it (an
optimized copy of a network and the network) share it safely.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import attrs
import numpy as np

from flowrt.engine.graph.graph import Graph
from flowrt.engine.graph.layers.io import ConstantDescriptor, InputDescriptor
from flowrt.errors import DataTypeError, GraphError, ShapeError
from flowrt.types import DataType, Dim, TensorInfo

# What a body's Input layer holds until the body is specialized for a use.
PLACEHOLDER = TensorInfo(None)


def _names(value: Any) -> tuple[str, ...]:
    names = tuple(value)
    if not all(isinstance(n, str) for n in names):
        raise GraphError(f"a body's inputs, captures and outputs are names (str), found {names!r}")
    return names


@attrs.frozen(eq=False)
class Body:
    """A subgraph of a control-flow layer: ``graph`` with an Input layer per name of ``inputs``
    (the formal inputs, in order) and of ``captures`` (outer values read by name), and an
    Output layer per name of ``outputs`` (in order). ``input_ranks`` are the ranks the model
    declares for the formal inputs (None where it declares none): a Loop feeds its iteration
    number and condition with the rank its body declares, as onnxruntime does.
    ``output_shapes`` are the shapes the model declares for the outputs (None where it
    declares none): onnxruntime shapes the scan outputs of a Loop that runs no iteration
    by them. ``name`` is the attribute that holds it, for messages ("then_branch")."""

    graph: Graph
    inputs: tuple[str, ...] = attrs.field(converter=_names)
    captures: tuple[str, ...] = attrs.field(default=(), converter=_names)
    outputs: tuple[str, ...] = attrs.field(default=(), converter=_names)
    input_ranks: tuple[int | None, ...] | None = attrs.field(default=None)
    output_shapes: tuple[tuple[Dim, ...] | None, ...] | None = attrs.field(default=None)
    name: str = "body"

    def __attrs_post_init__(self) -> None:
        inputs = [layer.descriptor.name for layer in self.graph.input_layers]
        outputs = [layer.descriptor.name for layer in self.graph.output_layers]
        expected = [*self.inputs, *self.captures]
        if sorted(inputs) != sorted(expected) or len(set(expected)) != len(expected):
            raise GraphError(
                f"a body's Input layers must be its inputs {list(self.inputs)} and captures "
                f"{list(self.captures)}, each once; its graph has {inputs}"
            )
        if sorted(outputs) != sorted(self.outputs) or len(set(outputs)) != len(outputs):
            raise GraphError(f"a body's Output layers must be {list(self.outputs)}; its graph has {outputs}")
        if self.output_shapes is not None and len(self.output_shapes) != len(self.outputs):
            raise GraphError(
                f"a body declares {len(self.output_shapes)} output shapes for {len(self.outputs)} outputs"
            )
        if self.input_ranks is not None and len(self.input_ranks) != len(self.inputs):
            raise GraphError(
                f"a body declares {len(self.input_ranks)} input ranks for {len(self.inputs)} inputs"
            )

    @classmethod
    def from_network(cls, network: Any, captures: Sequence[str] = ()) -> Body:
        """The body of a ``flowrt.Network``: its inputs not named in ``captures`` are the formal
        inputs, in the order they were added (their infos give ``input_ranks``; the others are
        set where the body is used); its outputs are the body's outputs."""
        names = [layer.descriptor.name for layer in network.graph.input_layers]
        infos = network.inputs
        formal = [n for n in names if n not in captures]
        outputs = [layer.descriptor.name for layer in network.graph.output_layers]
        return cls(network.graph, formal, captures, outputs, tuple(infos[n].rank for n in formal))

    def rank_of(self, index: int) -> int | None:
        """The rank the model declares for formal input ``index`` (None: undeclared)."""
        return None if self.input_ranks is None else self.input_ranks[index]

    def declared_shape(self, index: int) -> tuple[Dim, ...] | None:
        """The shape the model declares for output ``index`` (None: undeclared)."""
        return None if self.output_shapes is None else self.output_shapes[index]

    def specialize(
        self, infos: Sequence[TensorInfo | None], constants: Sequence[np.ndarray | None] = ()
    ) -> Graph:
        """A copy of the graph whose inputs (formal, then captures) have ``infos``, validated
        and its shapes inferred; a capture whose value is in ``constants`` (same order, None: not constant)
        becomes a Constant layer. ShapeError when an input has no info (an absent input)."""
        names = [*self.inputs, *self.captures]
        if len(infos) != len(names):
            raise ShapeError(f"a body of inputs {names} is given {len(infos)} infos")
        graph = self.graph.copy()
        layers = {layer.descriptor.name: layer for layer in graph.input_layers}
        values = [*constants, *[None] * (len(names) - len(constants))]
        for name, info, value in zip(names, infos, values):
            layer = layers[name]
            if value is not None and name in self.captures:
                constant = graph.add_layer("Constant", ConstantDescriptor(value), name=f"{layer.name}/value")
                graph.reroute(layer.outputs[0], constant.outputs[0])
                graph.remove_layer(layer)
            elif info is None:
                raise ShapeError(f"body input {name!r} is given no value (an absent input)")
            else:
                layer.descriptor = InputDescriptor(name, info)
        graph.validate()
        return graph

    def infer(self, infos: Sequence[TensorInfo | None]) -> list[TensorInfo]:
        """The infos of the body's outputs, in order, when its inputs have ``infos``."""
        return output_infos(self.specialize(infos), self.outputs)


def output_infos(graph: Graph, names: Sequence[str]) -> list[TensorInfo]:
    """The infos of the tensors ``graph``'s Output layers called ``names`` read, in order."""
    sources = {layer.descriptor.name: layer.inputs[0].source for layer in graph.output_layers}
    infos = []
    for name in names:
        source = sources[name]
        assert source is not None and source.info is not None  # inferred, every Output connected
        infos.append(source.info)
    return infos


def subgraphs_of(descriptor: Any) -> tuple[Body, ...]:
    """The bodies a layer's descriptor holds (an If's two branches, a Loop's or Scan's body);
    () for a layer of any other kind."""
    return tuple(getattr(descriptor, "subgraphs", ()))


def captures_field() -> Any:
    """The ``captures`` field of a descriptor with subgraphs: the names (str) of the outer
    values its bodies read, which are its layer's last inputs, in order."""
    return attrs.field(
        default=(),
        converter=tuple,
        validator=attrs.validators.deep_iterable(attrs.validators.instance_of(str)),
    )


def check_captures(bodies: Sequence[Body], captures: Sequence[str]) -> None:
    """ValueError naming the body that reads an outer value ``captures`` lacks."""
    for body in bodies:
        unread = [name for name in body.captures if name not in captures]
        if unread:
            raise ValueError(
                f"{body.name} reads outer values {unread}, which captures {list(captures)} lacks"
            )


def capture_infos(body: Body, captures: Sequence[str], infos: Sequence[TensorInfo | None]) -> list:
    """The infos of ``body``'s captures, from ``infos``, those of a layer's captured inputs
    (called ``captures``)."""
    by_name = dict(zip(captures, infos))
    return [by_name[name] for name in body.captures]


def merge_infos(a: TensorInfo, b: TensorInfo) -> TensorInfo:
    """An info true of tensors of info ``a`` and of ``b`` (of one dtype): dims they disagree on
    are unknown, and the rank too where theirs differ."""
    if a.shape is None or b.shape is None or len(a.shape) != len(b.shape):
        return TensorInfo(None, a.dtype)
    dims: list[Dim] = [x if x == y else None for x, y in zip(a.shape, b.shape)]
    return TensorInfo(tuple(dims), a.dtype)


def check_same_dtype(a: TensorInfo, b: TensorInfo, what: str) -> None:
    """DataTypeError naming ``what`` when ``a`` and ``b`` differ in data type."""
    if a.dtype != b.dtype:
        raise DataTypeError(f"{what}: expected {a.dtype.name.lower()}, found {b.dtype.name.lower()}")


def stable_infos(
    initial: Sequence[TensorInfo], step: Callable[[list[TensorInfo]], list[TensorInfo]], what: str
) -> tuple[list[TensorInfo], list[TensorInfo]]:
    """Infos of values carried from one iteration to the next (a Loop's carried values, a
    Scan's states) that hold in every iteration, and the body's outputs for them.

    ``step(carried)`` gives the body's outputs when the carried values have the infos
    ``carried``; its first ``len(initial)`` are the next carried values. Dims that change
    from one iteration to the next become unknown, as onnx and onnxruntime merge them, so a
    body specialized with these infos never folds a shape that a later iteration changes.
    """
    carried = list(initial)
    while True:  # each round only forgets dims: it ends
        outputs = step(carried)
        for i, (before, after) in enumerate(zip(carried, outputs)):
            check_same_dtype(before, after, f"{what} {i} (the body's output {i} against its input)")
        merged = [merge_infos(a, b) for a, b in zip(carried, outputs)]
        if merged == carried:
            return carried, outputs
        carried = merged


def stacked_info(element: TensorInfo, count: Dim, axis: int) -> TensorInfo:
    """The info of ``count`` tensors of info ``element`` stacked along a new ``axis`` (in
    [0, rank])."""
    if element.shape is None:
        return TensorInfo(None, element.dtype)
    shape = element.shape
    return TensorInfo((*shape[:axis], count, *shape[axis:]), element.dtype)


def scalar_info(dtype: DataType, rank: int | None) -> TensorInfo:
    """A one-element tensor of ``dtype``: of shape () or, where a body declares rank 1, (1,)."""
    return TensorInfo((1,) if rank == 1 else (), dtype)
