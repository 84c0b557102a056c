"""BitCast (opset 26): the same bytes read as another type of the same width."""

from __future__ import annotations

import attrs

from flowrt.engine.graph.layer_kind import layer_kind
from flowrt.engine.graph.layers.elementwise import onnx_dtype_to_datatype
from flowrt.errors import DataTypeError
from flowrt.types import DataType, TensorInfo


@attrs.frozen
class BitCastDescriptor:
    """BitCast: the input's bits, unchanged, as elements of ONNX data type ``to`` (a
    TensorProto number), which must be as wide as the input's type; little endian."""

    to: int


def bitcast_target(desc: BitCastDescriptor, source: DataType) -> DataType:
    """The output type; DataTypeError when either type cannot be bit-cast by flowrt or their
    widths differ."""
    target = onnx_dtype_to_datatype(desc.to)
    for dtype, role in ((source, "input"), (target, "target 'to'")):
        if dtype is DataType.STRING:
            raise DataTypeError(f"BitCast: {role} type {dtype.name.lower()} cannot be bit-cast by flowrt")
    # ONNX's widths: int4 is 4 bits, though flowrt keeps it in a byte.
    if source.bits != target.bits:
        raise DataTypeError(
            f"BitCast: a target as wide as the input expected: {source.name.lower()} is "
            f"{source.bits} bits, {target.name.lower()} {target.bits}"
        )
    return target


@layer_kind("BitCast", BitCastDescriptor)
def infer_bitcast(desc: BitCastDescriptor, inputs, consts):
    (x,) = inputs
    return [TensorInfo(x.shape, bitcast_target(desc, x.dtype))]
