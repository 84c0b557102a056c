"""RNN, GRU and LSTM: recurrent layers over a sequence, one or two directions.

Inputs are ONNX's: X, W, R, then the optional B, sequence_lens, initial_h (and for LSTM
initial_c and P, the peepholes). Outputs are Y (every step's hidden state), Y_h (the last
one) and, for LSTM, Y_c (the last cell state); each may be left out, the trailing ones by
leaving them off the node (``num_outputs``). ``layout`` 0 puts the sequence first (X is
(seq, batch, input)), 1 the batch (X is (batch, seq, input)).

The cell activations are read with :func:`cell_activations`: the names the spec lists (any
case), their ``activation_alpha``/``activation_beta`` taken in order by the activations that
use them, as onnxruntime reads them.
"""

from __future__ import annotations

from typing import ClassVar

import attrs
import numpy as np

from flowrt.engine.graph.layer_kind import as_tuple, layer_kind
from flowrt.engine.graph.layers.elementwise import FLOAT_TYPES, expect_dtype
from flowrt.errors import ShapeError, UnsupportedLayerError
from flowrt.types import DataType, Dim, TensorInfo

DIRECTIONS = ("forward", "reverse", "bidirectional")
LENGTH_TYPES = frozenset({DataType.INT32, DataType.INT64})

# Spec name -> (default alpha, default beta, how many of alpha and beta it takes). The
# defaults are those of the ONNX operators of the same name, as the spec says (ScaledTanh's
# operator has none: 1, 1); onnxruntime reads 0 for Affine's, ScaledTanh's and
# ThresholdedRelu's when the lists run short.
ACTIVATION_PARAMETERS: dict[str, tuple[float, float, int]] = {
    "Sigmoid": (0.0, 0.0, 0), "Tanh": (0.0, 0.0, 0), "Relu": (0.0, 0.0, 0),
    "Softsign": (0.0, 0.0, 0), "Softplus": (0.0, 0.0, 0),
    "LeakyRelu": (0.01, 0.0, 1), "ThresholdedRelu": (1.0, 0.0, 1), "Elu": (1.0, 0.0, 1),
    "HardSigmoid": (0.2, 0.5, 2), "Affine": (1.0, 0.0, 2), "ScaledTanh": (1.0, 1.0, 2),
}  # fmt: skip
_BY_LOWER_NAME = {name.lower(): name for name in ACTIVATION_PARAMETERS}


@attrs.frozen
class CellActivation:
    """One activation of a cell: its spec name and its alpha and beta (0 where unused)."""

    name: str
    alpha: float = 0.0
    beta: float = 0.0


def _flag(instance: object, attribute: attrs.Attribute, value: int) -> None:
    if value not in (0, 1):
        raise ValueError(f"{attribute.name!r} expects 0 or 1, got {value!r}")


def _positive_or_none(instance: object, attribute: attrs.Attribute, value: float | None) -> None:
    if value is not None and not value > 0:
        raise ValueError(f"{attribute.name!r} expects a value > 0, got {value!r}")


@attrs.frozen
class RecurrentDescriptor:
    """The attributes RNN, GRU and LSTM share. ``clip`` bounds every gate's input to
    [-clip, clip] (None: unbounded); ``hidden_size`` may be left out (R's shape gives it);
    ``output_sequence`` (opset 1) changes nothing: Y is produced when the node asks for it."""

    op: ClassVar[str] = ""
    gates: ClassVar[int] = 1  # blocks of hidden_size rows in W and R
    default_activations: ClassVar[tuple[str, ...]] = ()

    activation_alpha: tuple[float, ...] | None = attrs.field(default=None, converter=as_tuple)
    activation_beta: tuple[float, ...] | None = attrs.field(default=None, converter=as_tuple)
    activations: tuple[str, ...] | None = attrs.field(default=None, converter=as_tuple)
    clip: float | None = attrs.field(default=None, validator=_positive_or_none)
    direction: str = attrs.field(default="forward", validator=attrs.validators.in_(DIRECTIONS))
    hidden_size: int | None = attrs.field(default=None, validator=_positive_or_none)
    layout: int = attrs.field(default=0, validator=_flag)
    output_sequence: int = attrs.field(default=0, validator=_flag)
    # None: all the op's outputs (Y, Y_h and, for LSTM, Y_c)
    num_outputs: int | None = attrs.field(default=None, validator=attrs.validators.in_((None, 0, 1, 2, 3)))

    def __attrs_post_init__(self) -> None:
        cell_activations(self)  # unknown names and wrong counts fail where the descriptor is made
        if self.num_outputs is not None and self.num_outputs > self.max_outputs:
            raise ValueError(f"{self.op} has at most {self.max_outputs} outputs, got {self.num_outputs}")

    @property
    def max_outputs(self) -> int:
        """Y, Y_h, and Y_c for LSTM."""
        return 3 if self.op == "LSTM" else 2

    @property
    def num_directions(self) -> int:
        """2 for a bidirectional layer, else 1: the first dim of W, R, B and P."""
        return 2 if self.direction == "bidirectional" else 1


@attrs.frozen
class RNNDescriptor(RecurrentDescriptor):
    """RNN: ``H = f(X W^T + H R^T + Wb + Rb)``, f Tanh unless ``activations`` says otherwise."""

    op: ClassVar[str] = "RNN"
    gates: ClassVar[int] = 1
    default_activations: ClassVar[tuple[str, ...]] = ("Tanh",)


@attrs.frozen
class GRUDescriptor(RecurrentDescriptor):
    """GRU, gates (z, r, h) in that order in W, R and B; ``linear_before_reset`` 1 applies the
    reset gate after the recurrent product (``r * (H Rh^T + Rbh)``) instead of before it."""

    op: ClassVar[str] = "GRU"
    gates: ClassVar[int] = 3
    default_activations: ClassVar[tuple[str, ...]] = ("Sigmoid", "Tanh")

    linear_before_reset: int = attrs.field(default=0, validator=_flag)


@attrs.frozen
class LSTMDescriptor(RecurrentDescriptor):
    """LSTM, gates (i, o, f, c) in that order in W, R and B, peepholes (i, o, f) in P;
    ``input_forget`` 1 couples the forget gate to the input gate (f = 1 - i)."""

    op: ClassVar[str] = "LSTM"
    gates: ClassVar[int] = 4
    default_activations: ClassVar[tuple[str, ...]] = ("Sigmoid", "Tanh", "Tanh")

    input_forget: int = attrs.field(default=0, validator=_flag)


def cell_activations(desc: RecurrentDescriptor) -> tuple[tuple[CellActivation, ...], ...]:
    """Each direction's activations (f; f, g for GRU; f, g, h for LSTM) with their alpha and
    beta. One direction's worth given to a bidirectional layer serves both.

    Raises UnsupportedLayerError for a name the spec does not list, ValueError for a list of
    the wrong length."""
    per_direction = len(desc.default_activations)
    names = desc.activations or desc.default_activations * desc.num_directions
    if len(names) not in (per_direction, per_direction * desc.num_directions):
        raise ValueError(
            f"{desc.op} (direction {desc.direction}) expects {per_direction * desc.num_directions} "
            f"activations, got {list(names)}"
        )
    alphas, betas = list(desc.activation_alpha or ()), list(desc.activation_beta or ())
    resolved = []
    for given in names:
        name = _BY_LOWER_NAME.get(str(given).lower())
        if name is None:
            raise UnsupportedLayerError(
                f"{desc.op}: activation {given!r} is not supported; the spec's are "
                f"{', '.join(ACTIVATION_PARAMETERS)}"
            )
        alpha, beta, count = ACTIVATION_PARAMETERS[name]
        if count >= 1 and alphas:
            alpha = alphas.pop(0)
        if count >= 2 and betas:
            beta = betas.pop(0)
        resolved.append(CellActivation(name, float(alpha), float(beta)))
    if len(resolved) == per_direction:
        resolved *= desc.num_directions
    return tuple(
        tuple(resolved[d * per_direction : (d + 1) * per_direction]) for d in range(desc.num_directions)
    )


def sequence_lengths(lens: np.ndarray | None, seq: int, batch: int, op: str) -> np.ndarray:
    """Each batch entry's length as int64 (``seq`` for all when ``lens`` is absent); ShapeError
    for a value outside [0, seq] or a count other than ``batch``."""
    if lens is None:
        return np.full(batch, seq, np.int64)
    lengths = np.asarray(lens).astype(np.int64).reshape(-1)
    if lengths.shape != (batch,) or np.any(lengths < 0) or np.any(lengths > seq):
        raise ShapeError(
            f"{op}: sequence_lens of {batch} values in [0, {seq}] expected, got {np.asarray(lens).tolist()}"
        )
    return lengths


def _check_shape(info: TensorInfo | None, expected: tuple[Dim, ...], what: str, op: str) -> None:
    """ShapeError when ``info``'s shape has another rank than ``expected`` or differs in a dim
    known on both sides."""
    if info is None or info.shape is None:
        return
    fits = len(info.shape) == len(expected) and all(
        not isinstance(a, int) or not isinstance(b, int) or a == b
        for a, b in zip(info.shape, expected, strict=True)
    )
    if not fits:
        shown = TensorInfo(tuple(d if isinstance(d, int) else None for d in expected)).format_shape()
        raise ShapeError(f"{op}: {what} of shape {shown} expected, got {info.format_shape()}")


def _dim(shape: tuple[Dim, ...] | None, axis: int) -> Dim:
    return None if shape is None or len(shape) <= axis else shape[axis]


def _hidden_size(desc: RecurrentDescriptor, w: TensorInfo, r: TensorInfo) -> Dim:
    """hidden_size from the attribute, else from R (or W); ShapeError when they disagree."""
    from_r = _dim(r.shape, 2)
    rows = _dim(w.shape, 1)
    from_w = rows // desc.gates if isinstance(rows, int) else None
    known = [h for h in (desc.hidden_size, from_r, from_w) if isinstance(h, int)]
    if len(set(known)) > 1:
        raise ShapeError(
            f"{desc.op}: hidden_size {desc.hidden_size}, W {w.format_shape()} and R {r.format_shape()} "
            "disagree"
        )
    return known[0] if known else None


def infer_recurrent(desc: RecurrentDescriptor, inputs, consts) -> list[TensorInfo]:
    """Y, Y_h (and Y_c) of an RNN, GRU or LSTM, after checking every input given."""
    op = desc.op
    inputs = list(inputs) + [None] * (8 - len(inputs))
    x, w, r, b, lens, h0, c0, p = inputs[:8]
    expect_dtype(x, FLOAT_TYPES, f"{op} input X")
    for info, what in ((w, "W"), (r, "R"), (b, "B"), (h0, "initial_h"), (c0, "initial_c"), (p, "P")):
        if info is not None:
            expect_dtype(info, frozenset({x.dtype}), f"{op} input {what} (X's type)")
    if lens is not None:
        expect_dtype(lens, LENGTH_TYPES, f"{op} input sequence_lens")
    _check_shape(x, (None, None, None), "X", op)
    seq, batch = (_dim(x.shape, 1), _dim(x.shape, 0)) if desc.layout else (_dim(x.shape, 0), _dim(x.shape, 1))
    hidden = _hidden_size(desc, w, r)
    dirs, rows = desc.num_directions, hidden * desc.gates if isinstance(hidden, int) else None
    _check_shape(w, (dirs, rows, _dim(x.shape, 2)), "W", op)
    _check_shape(r, (dirs, rows, hidden), "R", op)
    _check_shape(b, (dirs, None if rows is None else 2 * rows), "B", op)
    _check_shape(lens, (batch,), "sequence_lens", op)
    state = (batch, dirs, hidden) if desc.layout else (dirs, batch, hidden)
    _check_shape(h0, state, "initial_h", op)
    _check_shape(c0, state, "initial_c", op)
    _check_shape(p, (dirs, None if hidden is None else 3 * hidden), "P", op)
    y = (batch, seq, dirs, hidden) if desc.layout else (seq, dirs, batch, hidden)
    outputs = [TensorInfo(y, x.dtype), TensorInfo(state, x.dtype), TensorInfo(state, x.dtype)]
    return outputs[: desc.max_outputs if desc.num_outputs is None else desc.num_outputs]


layer_kind("RNN", RNNDescriptor, min_inputs=3, max_inputs=6, num_outputs=None)(infer_recurrent)
layer_kind("GRU", GRUDescriptor, min_inputs=3, max_inputs=6, num_outputs=None)(infer_recurrent)
layer_kind("LSTM", LSTMDescriptor, min_inputs=3, max_inputs=8, num_outputs=None)(infer_recurrent)
