"""Input, Output and Constant layers: where tensors enter, leave, or are fixed."""

from __future__ import annotations

import attrs
import numpy as np

from flowrt.engine.graph.layer_kind import layer_kind
from flowrt.types import TensorInfo


@attrs.frozen
class InputDescriptor:
    """A network input: the name feeds use, and the expected info (dims may be symbolic)."""

    name: str
    info: TensorInfo


@attrs.frozen
class OutputDescriptor:
    """A network output: the name results are returned under."""

    name: str


def _as_array(value: object) -> np.ndarray:
    array = np.asarray(value)
    array.setflags(write=False)
    return array


@attrs.frozen(eq=False)
class ConstantDescriptor:
    """A constant tensor (weights, biases, folded values); the array is read-only."""

    value: np.ndarray = attrs.field(converter=_as_array)


@layer_kind("Input", InputDescriptor, min_inputs=0, max_inputs=0)
def infer_input(desc: InputDescriptor, inputs, consts):
    return [desc.info]


@layer_kind("Output", OutputDescriptor, min_inputs=1, max_inputs=1, num_outputs=0)
def infer_output(desc: OutputDescriptor, inputs, consts):
    return []


@layer_kind("Constant", ConstantDescriptor, min_inputs=0, max_inputs=0)
def infer_constant(desc: ConstantDescriptor, inputs, consts):
    return [TensorInfo.of(desc.value)]
