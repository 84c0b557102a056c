"""Elementwise layers: unary math, binary arithmetic and comparisons, variadic reductions
across inputs (Max, Min, Sum, Mean), Where, Cast and CastLike, Identity and Dropout.

Binary and variadic kinds broadcast like numpy (opset 7 on). Before opset 7 the binary kinds
took ``broadcast``/``axis`` attributes: without ``broadcast`` both shapes must be equal; with it,
B's dims line up with A's from ``axis`` (from the end when unset) and the output has A's shape.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence

import attrs
import numpy as np

from flowrt.engine.graph.layer_kind import as_tuple, layer_kind
from flowrt.engine.graph.shapes import broadcast_shapes
from flowrt.errors import DataTypeError, ShapeError, UnsupportedLayerError
from flowrt.types import DataType, Dim, TensorInfo

D = DataType
FLOAT_TYPES = frozenset({D.FLOAT16, D.FLOAT32, D.FLOAT64, D.BFLOAT16})
SIGNED_TYPES = frozenset({D.INT8, D.INT16, D.INT32, D.INT64})
INT_TYPES = SIGNED_TYPES | {D.UINT8, D.UINT16, D.UINT32, D.UINT64}
NUMERIC_TYPES = FLOAT_TYPES | INT_TYPES
ANY_TYPE = frozenset(DataType)

# TensorProto.DataType values, hard-coded so that the engine does not depend on onnx.
_ONNX_DTYPES = {
    1: D.FLOAT32, 2: D.UINT8, 3: D.INT8, 4: D.UINT16, 5: D.INT16, 6: D.INT32, 7: D.INT64,
    8: D.STRING, 9: D.BOOL, 10: D.FLOAT16, 11: D.FLOAT64, 12: D.UINT32, 13: D.UINT64, 16: D.BFLOAT16,
    17: D.FLOAT8E4M3FN, 18: D.FLOAT8E4M3FNUZ, 19: D.FLOAT8E5M2, 20: D.FLOAT8E5M2FNUZ, 21: D.UINT4,
    22: D.INT4, 23: D.FLOAT4E2M1, 24: D.FLOAT8E8M0, 25: D.UINT2, 26: D.INT2, 27: D.FLOAT6E2M3,
    28: D.FLOAT6E3M2,
}  # fmt: skip
_ONNX_ONLY_DTYPES = {14: "COMPLEX64", 15: "COMPLEX128"}
# Opset 1-5 Cast names its target by TensorProto name rather than number.
_ONNX_DTYPE_NAMES = {
    "FLOAT": 1, "UINT8": 2, "INT8": 3, "UINT16": 4, "INT16": 5, "INT32": 6, "INT64": 7, "STRING": 8,
    "BOOL": 9, "FLOAT16": 10, "DOUBLE": 11, "UINT32": 12, "UINT64": 13, "BFLOAT16": 16,
}  # fmt: skip


def onnx_dtype_to_datatype(code: int) -> DataType:
    """The DataType of an ONNX TensorProto data type number; DataTypeError for one flowrt lacks."""
    if code in _ONNX_DTYPES:
        return _ONNX_DTYPES[code]
    name = _ONNX_ONLY_DTYPES.get(code, "an unknown type")
    raise DataTypeError(f"ONNX data type {code} ({name}) has no flowrt DataType")


def expect_dtype(info: TensorInfo, allowed: frozenset[DataType], what: str) -> None:
    """Raise DataTypeError when ``info``'s data type is not one of ``allowed``."""
    if info.dtype not in allowed:
        names = ", ".join(sorted(d.name.lower() for d in allowed))
        raise DataTypeError(f"{what} expects one of {names}, got {info.dtype.name.lower()}")


def expect_same_dtype(infos: Sequence[TensorInfo], what: str) -> None:
    """Raise DataTypeError unless every info has the same data type."""
    if len({i.dtype for i in infos}) > 1:
        found = ", ".join(i.dtype.name.lower() for i in infos)
        raise DataTypeError(f"{what} expects inputs of one data type, got {found}")


def same_info_infer(allowed: frozenset[DataType], out_dtype: DataType | None = None) -> Callable:
    """An infer function for a one-input kind: the output has the input's shape, and its dtype
    (or ``out_dtype``); ``allowed`` are the input dtypes the kind accepts."""

    def infer(desc, inputs, consts):
        x = inputs[0]
        expect_dtype(x, allowed, "input")
        return [x if out_dtype is None else x.with_dtype(out_dtype)]

    return infer


@attrs.frozen
class LegacyUnaryDescriptor:
    """A one-input op whose opset 1 form carried the ``consumed_inputs`` hint (ignored)."""

    consumed_inputs: tuple[int, ...] | None = attrs.field(default=None, converter=as_tuple)


_LEGACY_FLOAT_UNARY = ["Exp", "Log", "Sqrt", "Reciprocal", "Floor", "Ceil"]
_FLOAT_UNARY = ["Round", "Sin", "Cos", "Tan", "Asin", "Acos", "Atan",
                "Sinh", "Cosh", "Asinh", "Acosh", "Atanh"]  # fmt: skip

layer_kind(_LEGACY_FLOAT_UNARY, LegacyUnaryDescriptor)(same_info_infer(FLOAT_TYPES))
layer_kind(["Abs"], LegacyUnaryDescriptor)(same_info_infer(NUMERIC_TYPES))
layer_kind(["Neg"], LegacyUnaryDescriptor)(same_info_infer(FLOAT_TYPES | SIGNED_TYPES))
layer_kind(_FLOAT_UNARY)(same_info_infer(FLOAT_TYPES))
layer_kind(["Sign", "Erf"])(same_info_infer(NUMERIC_TYPES))
layer_kind("Not")(same_info_infer(frozenset({D.BOOL})))
layer_kind("IsNaN")(same_info_infer(FLOAT_TYPES, D.BOOL))
layer_kind("Identity")(same_info_infer(ANY_TYPE))


@attrs.frozen
class IsInfDescriptor:
    """IsInf: which infinities count."""

    detect_negative: int = attrs.field(default=1, validator=attrs.validators.in_((0, 1)))
    detect_positive: int = attrs.field(default=1, validator=attrs.validators.in_((0, 1)))


layer_kind("IsInf", IsInfDescriptor)(same_info_infer(FLOAT_TYPES, D.BOOL))


@attrs.frozen
class DropoutDescriptor:
    """Dropout at inference: the output is the input, the optional mask all True (all ones of
    the data type before opset 10). ``ratio`` (before opset 12) and ``seed`` do not change
    that. Training-mode Dropout is refused: a ``training_mode`` input that is true with a ratio
    not known to be 0, and before opset 7 an ``is_test`` of 0 given in the model (left out, it
    is read as inference, as onnx's version converter and ONNX Runtime's importers do)."""

    ratio: float = 0.5
    is_test: int | None = attrs.field(default=None, validator=attrs.validators.in_((None, 0, 1)))
    consumed_inputs: tuple[int, ...] | None = attrs.field(default=None, converter=as_tuple)
    seed: int | None = None
    opset: int = 22
    num_outputs: int = attrs.field(default=1, validator=attrs.validators.in_((1, 2)))


_TRAINING_DROPOUT = "training-mode Dropout is not supported (flowrt runs inference only)"


def check_dropout_inference(
    ratio: np.ndarray | None, training_mode: np.ndarray | None, *, ratio_known: bool = True
) -> None:
    """Refuse a Dropout that would drop: ``training_mode`` true with a ``ratio`` that is not 0
    (None: left out, 0.5) or not known (``ratio_known`` False: an input of the graph)."""
    if training_mode is None or not bool(np.asarray(training_mode).reshape(-1)[0]):
        return
    if not ratio_known:
        raise UnsupportedLayerError(
            f"{_TRAINING_DROPOUT}: training_mode is true and the ratio is not a constant, so it may drop"
        )
    if ratio is None or float(np.asarray(ratio).reshape(-1)[0]) != 0.0:
        raise UnsupportedLayerError(f"{_TRAINING_DROPOUT}: training_mode is true and the ratio is not 0")


@layer_kind("Dropout", DropoutDescriptor, min_inputs=1, max_inputs=3, num_outputs=None)
def infer_dropout(desc: DropoutDescriptor, inputs, consts):
    if desc.opset < 7 and desc.is_test == 0:
        raise UnsupportedLayerError(
            f"{_TRAINING_DROPOUT}: is_test=0 (opset {desc.opset}) asks for training; set is_test=1 or leave it out"
        )
    x = inputs[0]
    training_mode = consts[2] if len(consts) > 2 else None
    # A training_mode that is an input of the graph is checked when the layer runs (the
    # optimizer keeps such a Dropout for that, see ``remove_pass_through``).
    ratio_known = len(inputs) < 2 or inputs[1] is None or consts[1] is not None
    check_dropout_inference(consts[1] if len(consts) > 1 else None, training_mode, ratio_known=ratio_known)
    mask = x.with_dtype(D.BOOL if desc.opset >= 10 else x.dtype)
    return [x, mask][: desc.num_outputs]


@attrs.frozen
class LegacyBinaryDescriptor:
    """A binary op with a pre-opset-7 form: ``broadcast``, ``axis`` and ``consumed_inputs``
    only matter when ``opset`` < 7 (see the module docstring)."""

    broadcast: int = attrs.field(default=0, validator=attrs.validators.in_((0, 1)))
    axis: int | None = None
    consumed_inputs: tuple[int, ...] | None = attrs.field(default=None, converter=as_tuple)
    opset: int = 22

    @property
    def legacy(self) -> bool:
        return self.opset < 7


def legacy_b_shape(
    a_shape: Sequence[Dim], b_shape: Sequence[Dim], desc: LegacyBinaryDescriptor
) -> tuple[Dim, ...]:
    """B's shape padded with 1s to A's rank so that numpy broadcasting lines it up with A as the
    pre-opset-7 rule says; ShapeError when it does not fit."""
    a_shape, b_shape = tuple(a_shape), tuple(b_shape)
    if not desc.broadcast:
        if len(a_shape) != len(b_shape) or any(
            isinstance(x, int) and isinstance(y, int) and x != y
            for x, y in zip(a_shape, b_shape, strict=True)
        ):
            raise ShapeError(f"without broadcast=1 (opset < 7), B's shape {b_shape} must equal A's {a_shape}")
        return b_shape
    if all(d == 1 for d in b_shape):
        return (1,) * len(a_shape)  # a single element goes with any A
    axis = len(a_shape) - len(b_shape) if desc.axis is None else desc.axis
    if axis < 0:
        axis += len(a_shape)
    if not 0 <= axis <= len(a_shape) - len(b_shape):
        raise ShapeError(f"B's shape {b_shape} does not fit in A's shape {a_shape} from axis {desc.axis}")
    for a, b in zip(a_shape[axis:], b_shape, strict=False):
        if isinstance(a, int) and isinstance(b, int) and b not in (1, a):
            raise ShapeError(f"B's shape {b_shape} does not match A's shape {a_shape} from axis {axis}")
    return (1,) * axis + b_shape + (1,) * (len(a_shape) - axis - len(b_shape))


def binary_infer(
    allowed: frozenset[DataType], out_dtype: DataType | None = None, same_dtype: bool = True
) -> Callable:
    """An infer function for a two-input broadcasting kind; the output has A's dtype (or
    ``out_dtype``). ``same_dtype``: both inputs must share a dtype (false only for Pow)."""

    def infer(desc, inputs, consts):
        a, b = inputs
        expect_dtype(a, allowed, "input A")
        expect_dtype(b, allowed, "input B")
        if same_dtype:
            expect_same_dtype([a, b], "binary op")
        if isinstance(desc, LegacyBinaryDescriptor) and desc.legacy:
            if a.shape is not None and b.shape is not None:
                legacy_b_shape(a.shape, b.shape, desc)
            shape = a.shape
        else:
            shape = broadcast_shapes(a.shape, b.shape, where="binary op")
        return [TensorInfo(shape, a.dtype if out_dtype is None else out_dtype)]

    return infer


# The binary kinds: two inputs each.
_binary = functools.partial(layer_kind, min_inputs=2, max_inputs=2)
_binary(["Add", "Sub", "Mul", "Div"], LegacyBinaryDescriptor)(binary_infer(NUMERIC_TYPES))
_binary("Pow", LegacyBinaryDescriptor)(binary_infer(NUMERIC_TYPES, same_dtype=False))
_binary(["And", "Or", "Xor"], LegacyBinaryDescriptor)(binary_infer(frozenset({D.BOOL})))
_binary("Equal", LegacyBinaryDescriptor)(binary_infer(ANY_TYPE, D.BOOL))
_binary(["Less", "Greater"], LegacyBinaryDescriptor)(binary_infer(NUMERIC_TYPES, D.BOOL))
_binary(["LessOrEqual", "GreaterOrEqual"])(binary_infer(NUMERIC_TYPES, D.BOOL))


@attrs.frozen
class ModDescriptor:
    """Mod: with ``fmod`` 0 the result takes the divisor's sign (Python's %), with 1 the
    dividend's (C's fmod). Float inputs with fmod 0 are defined from opset 28 and accepted in all."""

    fmod: int = attrs.field(default=0, validator=attrs.validators.in_((0, 1)))


_binary("Mod", ModDescriptor)(binary_infer(NUMERIC_TYPES))


@attrs.frozen
class BitShiftDescriptor:
    """BitShift: ``direction`` LEFT or RIGHT; shifts of the bit width or more give 0 (or -1)."""

    direction: str = attrs.field(validator=attrs.validators.in_(("LEFT", "RIGHT")))


_binary("BitShift", BitShiftDescriptor)(binary_infer(INT_TYPES))


@attrs.frozen
class VariadicDescriptor:
    """Max, Min, Sum, Mean over any number of broadcasting inputs (``consumed_inputs``: opset 1)."""

    consumed_inputs: tuple[int, ...] | None = attrs.field(default=None, converter=as_tuple)


@layer_kind(["Max", "Min", "Sum", "Mean"], VariadicDescriptor, min_inputs=1, max_inputs=None)
def infer_variadic(desc: VariadicDescriptor, inputs, consts):
    for x in inputs:
        expect_dtype(x, NUMERIC_TYPES, "each input")
    expect_same_dtype(inputs, "a variadic op")
    return [TensorInfo(broadcast_shapes(*(x.shape for x in inputs), where="inputs"), inputs[0].dtype)]


@layer_kind("Where", min_inputs=3, max_inputs=3)
def infer_where(desc, inputs, consts):
    cond, x, y = inputs
    expect_dtype(cond, frozenset({D.BOOL}), "condition")
    expect_same_dtype([x, y], "Where's X and Y")
    return [TensorInfo(broadcast_shapes(cond.shape, x.shape, y.shape, where="Where"), x.dtype)]


def _onnx_dtype_code(value: int | str) -> int:
    """The TensorProto number of ``to``: an int, or (opset 1-5) a TensorProto name."""
    if isinstance(value, str):
        if value.upper() not in _ONNX_DTYPE_NAMES:
            raise ValueError(f"'to' expects an ONNX data type name, got {value!r}")
        return _ONNX_DTYPE_NAMES[value.upper()]
    return int(value)


@attrs.frozen
class CastDescriptor:
    """Cast to the ONNX data type number ``to``. ``saturate`` only affects float8 targets,
    ``round_mode`` only float8e8m0 ones (ONNX's Cast tables)."""

    to: int = attrs.field(converter=_onnx_dtype_code)
    saturate: int = attrs.field(default=1, validator=attrs.validators.in_((0, 1)))
    round_mode: str = attrs.field(default="up", validator=attrs.validators.in_(("up", "down", "nearest")))


def cast_target(dtype: DataType) -> DataType:
    """``dtype`` when flowrt can cast to it; DataTypeError for string."""
    if dtype is D.STRING:
        raise DataTypeError(f"Cast to {dtype.name.lower()} is not supported")
    return dtype


@layer_kind("Cast", CastDescriptor)
def infer_cast(desc: CastDescriptor, inputs, consts):
    return [inputs[0].with_dtype(cast_target(onnx_dtype_to_datatype(desc.to)))]


@attrs.frozen
class CastLikeDescriptor:
    """CastLike: cast the first input to the second input's data type."""

    saturate: int = attrs.field(default=1, validator=attrs.validators.in_((0, 1)))
    round_mode: str = attrs.field(default="up", validator=attrs.validators.in_(("up", "down", "nearest")))


@layer_kind("CastLike", CastLikeDescriptor, min_inputs=2, max_inputs=2)
def infer_cast_like(desc: CastLikeDescriptor, inputs, consts):
    return [inputs[0].with_dtype(cast_target(inputs[1].dtype))]
