"""What an ONNX file must be before flowrt makes anything of it: text that is UTF-8, tensors
whose data holds what their dims declare, and constants that fit the memory budget.

A protobuf parser keeps a string field that is not UTF-8 as bytes (onnx's checker then fails
with UnicodeDecodeError, and a node named by bytes would make a layer named by bytes), and
numpy makes an array of whatever size a tensor's dims declare: a 100-byte file may declare
terabytes. Every such file is a ModelLoadError (ResourceError for a size over the budget)
naming the model, the field or tensor, what was expected and what was found.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
from google.protobuf.descriptor import FieldDescriptor
from onnx import numpy_helper

from flowrt.engine.graph.layers.elementwise import onnx_dtype_to_datatype
from flowrt.engine.memory.budget import MemoryBudget, tensor_bytes
from flowrt.errors import DataTypeError, ModelLoadError

# Element types ONNX packs below a byte each (low bits first): their bits per element.
_PACKED_BITS = {
    getattr(onnx.TensorProto, name): bits
    for name, bits in (
        ("INT4", 4), ("UINT4", 4), ("FLOAT4E2M1", 4), ("INT2", 2), ("UINT2", 2), ("FLOAT6E2M3", 6),
        ("FLOAT6E3M2", 6),
    )
    if hasattr(onnx.TensorProto, name)
}  # fmt: skip
_SHOWN_BYTES = 40


def _is_repeated(field: FieldDescriptor) -> bool:
    repeated = getattr(field, "is_repeated", None)  # protobuf >= 5.28; `label` before
    return bool(repeated) if repeated is not None else field.label == FieldDescriptor.LABEL_REPEATED


def _node_context(path: str, model: onnx.ModelProto) -> str:
    """ " (node 3, op Relu)" when ``path`` is inside a node of the main graph."""
    if not path.startswith("graph.node["):
        return ""
    index = int(path[len("graph.node[") : path.index("]")])
    op = model.graph.node[index].op_type
    return f" (node {index}, op {op})" if isinstance(op, str) else f" (node {index})"


def check_text(model: onnx.ModelProto, where: str) -> None:
    """Raise ModelLoadError for the first string field of ``model`` that is not UTF-8."""
    stack: list[tuple[Any, str]] = [(model, "")]
    while stack:
        message, path = stack.pop()
        for field, value in message.ListFields():
            name = f"{path}.{field.name}" if path else field.name
            repeated = _is_repeated(field)
            items = list(enumerate(value)) if repeated else [(None, value)]
            for i, item in items:
                at = name if i is None else f"{name}[{i}]"
                if field.type == FieldDescriptor.TYPE_STRING and isinstance(item, bytes):
                    shown = item[:_SHOWN_BYTES] + (b"..." if len(item) > _SHOWN_BYTES else b"")
                    raise ModelLoadError(
                        f"model {where}: {at}{_node_context(at, model)} must be UTF-8 text, found the "
                        f"bytes {shown!r}"
                    )
                if field.type == FieldDescriptor.TYPE_MESSAGE:
                    stack.append((item, at))


def _element_type(tensor: onnx.TensorProto, what: str) -> np.dtype:
    try:
        return np.dtype(onnx.helper.tensor_dtype_to_np_dtype(tensor.data_type))
    except (KeyError, ValueError, TypeError) as e:
        raise ModelLoadError(f"{what}: unknown element type {tensor.data_type}") from e


def _check_low_precision(tensor: onnx.TensorProto, array: np.ndarray, what: str) -> None:
    """ModelLoadError when onnx read a low-precision tensor as another dtype: older onnx
    releases read bfloat16, float8 and the 4-bit types into numpy's own dtypes."""
    try:
        expected = onnx_dtype_to_datatype(tensor.data_type)
    except DataTypeError:
        return  # complex: flowrt refuses it where it is used
    if expected.is_low_precision and array.dtype != expected.numpy:
        raise ModelLoadError(
            f"{what}: onnx {onnx.__version__} reads its {expected.name} data as {array.dtype}; "
            "flowrt needs onnx >= 1.18 (which reads it with ml_dtypes) for this type"
        )


class TensorReader:
    """Makes the arrays of a model's tensors (initializers, Constant values, tensor
    attributes), each checked and claimed from ``budget`` before it is made."""

    def __init__(self, where: str, budget: MemoryBudget) -> None:
        self.where = where
        self.budget = budget

    def _declared(self, dims: Any, dtype: np.dtype, what: str) -> tuple[tuple[int, ...], int]:
        shape = tuple(int(d) for d in dims)
        if any(d < 0 for d in shape):
            raise ModelLoadError(f"{what}: dims must be >= 0, found {shape}")
        count = tensor_bytes(shape, 1)
        self.budget.claim(count * dtype.itemsize, f"{what}, {dtype} of shape {shape},")
        return shape, count

    def array(self, tensor: onnx.TensorProto, what: str) -> np.ndarray:
        """The array of ``tensor`` (``what`` names it, e.g. "model m.onnx: initializer 'w'")."""
        if tensor.data_location == onnx.TensorProto.EXTERNAL:
            raise ModelLoadError(
                f"{what}: its data is in an external file, which was not read: load the model from "
                "its path (its external data is read from the model's directory)"
            )
        dtype = _element_type(tensor, what)
        shape, count = self._declared(tensor.dims, dtype, what)
        if tensor.HasField("raw_data") and dtype.kind != "O":
            bits = _PACKED_BITS.get(tensor.data_type)
            needed = -(-count * bits // 8) if bits else count * dtype.itemsize
            if len(tensor.raw_data) != needed:
                raise ModelLoadError(
                    f"{what}: raw_data holds {len(tensor.raw_data)} bytes; its {dtype} shape {shape} "
                    f"needs {needed}"
                )
        try:
            array = numpy_helper.to_array(tensor)  # unpacks the 4- and 2-bit types, low bits first
        except MemoryError as e:
            raise self.budget.out_of_memory(e, what) from e
        except Exception as e:  # onnx's own checks of the data: counts, types
            raise ModelLoadError(
                f"{what}: its data does not match its dims {shape}: {type(e).__name__}: {e}"
            ) from e
        _check_low_precision(tensor, array, what)
        return array

    def sparse(self, sparse: onnx.SparseTensorProto, what: str) -> np.ndarray:
        """The dense array of a sparse tensor, its indices checked against its dims."""
        values = self.array(sparse.values, f"{what} values")
        indices = self.array(sparse.indices, f"{what} indices")
        shape, count = self._declared(sparse.dims, values.dtype, what)
        rank_ok = indices.ndim == 1 or (indices.ndim == 2 and indices.shape[1] == len(shape))
        if values.ndim != 1 or indices.dtype.kind not in "iu" or not rank_ok or len(indices) != len(values):
            raise ModelLoadError(
                f"{what}: expected {len(values)} values and as many indices, each flat or one per dim "
                f"of {shape}; found values {values.shape}, indices {indices.dtype}{indices.shape}"
            )
        if indices.ndim == 2:
            if np.any(indices < 0) or np.any(indices >= np.asarray(shape, dtype=np.int64)):
                raise ModelLoadError(f"{what}: an index lies outside its dims {shape}")
            indices = np.ravel_multi_index(indices.T, shape) if len(indices) else indices.reshape(0)
        if np.any(indices < 0) or np.any(indices >= count):
            raise ModelLoadError(f"{what}: a flat index lies outside its {count} elements")
        try:
            dense = np.zeros(shape, dtype=values.dtype)
        except MemoryError as e:
            raise self.budget.out_of_memory(e, what) from e
        dense.reshape(-1)[indices] = values
        return dense


__all__ = ["TensorReader", "check_text"]
