"""DFT, STFT, the window functions and MelWeightMatrix: ONNX's signal operators (opset 17 on).

A complex tensor is a real one whose last dim of 2 holds (real, imaginary); a last dim of 1
is a real signal. A size that comes from a run-time input (a DFT length, a window's size,
STFT's frame step) leaves its dim unknown until the layer runs; the checks on such values
live here so that shape inference (on constants) and the kernels (at run time) share them.
"""

from __future__ import annotations

import attrs
import numpy as np

from flowrt.engine.graph.layer_kind import layer_kind
from flowrt.engine.graph.layers.detection import expect_dims, expect_one_value
from flowrt.engine.graph.layers.elementwise import (
    FLOAT_TYPES,
    INT_TYPES,
    expect_dtype,
    onnx_dtype_to_datatype,
)
from flowrt.errors import DataTypeError, GraphError, ShapeError
from flowrt.types import DataType, Dim, TensorInfo

COUNT_TYPES = frozenset({DataType.INT32, DataType.INT64})
# What a window or a mel matrix may be made as (the spec's T2 and T3).
GENERATED_TYPES = FLOAT_TYPES | INT_TYPES
_FIRST_AXIS_INPUT_OPSET = 20


def count_value(value: np.ndarray | None, what: str, where: str, minimum: int) -> int | None:
    """The integer held by a scalar input (None when not known); ShapeError below ``minimum``."""
    if value is None:
        return None
    value = np.asarray(value)
    if value.size != 1:
        raise ShapeError(f"{where}: {what} must be a scalar or hold one value, got shape {value.shape}")
    count = int(value.reshape(-1)[0])
    if count < minimum:
        raise ShapeError(f"{where}: {what} of at least {minimum} expected, got {count}")
    return count


def _expect_count_input(info: TensorInfo | None, what: str, where: str) -> None:
    if info is not None:
        expect_dtype(info, COUNT_TYPES, f"{where} input {what}")
        expect_one_value(info, what, where)


def _datatype_code(code: int) -> int:
    """Validator's side of ``output_datatype``: a code of a type these operators make."""
    dtype = onnx_dtype_to_datatype(code)
    if dtype not in GENERATED_TYPES:
        raise DataTypeError(f"output_datatype of a numeric type expected, got {dtype.name.lower()}")
    return code


# ---------------------------------------------------------------------------------------- DFT


@attrs.frozen
class DFTDescriptor:
    """DFT: the discrete Fourier transform along one axis of a real ([..., 1]) or complex
    ([..., 2]) input. The axis is an attribute before opset 20 (default 1) and the third
    input from opset 20 (default -2); it may not be the last dim. ``inverse`` 1: the inverse
    transform, scaled by 1 / length. ``onesided`` 1: forward, only the first length // 2 + 1
    bins; inverse, the input is such a half spectrum and the output real ([..., 1]). The
    transform's length is the dft_length input, or the axis's size (2 * (size - 1) for an
    inverse one-sided one); the signal is cut or zero-padded to it."""

    opset: int = _FIRST_AXIS_INPUT_OPSET
    axis: int | None = None
    inverse: int = attrs.field(default=0, validator=attrs.validators.in_((0, 1)))
    onesided: int = attrs.field(default=0, validator=attrs.validators.in_((0, 1)))

    def __attrs_post_init__(self) -> None:
        if self.axis is not None and self.opset >= _FIRST_AXIS_INPUT_OPSET:
            raise ValueError(
                f"DFT takes its axis as an input from opset {_FIRST_AXIS_INPUT_OPSET}, "
                f"not as an attribute (this model is opset {self.opset})"
            )

    @property
    def output_channels(self) -> int:
        """The output's last dim: 1 (real) for an inverse one-sided transform, else 2."""
        return 1 if self.inverse and self.onesided else 2


def dft_axis(desc: DFTDescriptor, axis_input: int | None, rank: int) -> int:
    """The transformed axis, non-negative, of a rank-``rank`` input (its last dim counted);
    ShapeError when it is out of range or the last dim."""
    if desc.opset < _FIRST_AXIS_INPUT_OPSET:
        axis = 1 if desc.axis is None else desc.axis
    else:
        axis = -2 if axis_input is None else axis_input
    if not -rank <= axis <= rank - 2 or axis == -1:
        raise ShapeError(
            f"DFT: axis in [{-rank}, -2] or [0, {rank - 2}] expected for a rank-{rank} input "
            f"(its last dim holds real and imaginary parts), got {axis}"
        )
    return axis % rank


def dft_length(desc: DFTDescriptor, size: int, given: int | None) -> int:
    """The transform's length over an axis of ``size``: ``given``, else the default above;
    ShapeError when it comes out below 1."""
    if given is not None:
        return given
    length = 2 * (size - 1) if desc.inverse and desc.onesided else size
    if length < 1:
        raise ShapeError(
            f"DFT: an axis of size {size} gives a transform of length {length}; "
            "a length of at least 1 expected (give the dft_length input)"
        )
    return length


def dft_bins(desc: DFTDescriptor, length: int) -> int:
    """The output's size along the axis for a transform of ``length``."""
    return length // 2 + 1 if desc.onesided and not desc.inverse else length


def _dft_axis_dim(desc: DFTDescriptor, size: Dim, given: int | None, has_length_input: bool) -> Dim:
    """The output's dim along the axis: from the dft_length input when there is one (unknown
    until it runs if not a constant), else from the axis's size."""
    if has_length_input:
        return None if given is None else dft_bins(desc, given)
    if isinstance(size, int):
        return dft_bins(desc, dft_length(desc, size, None))
    return None if desc.onesided else size  # a symbolic dim stays when the length is its own


def _expect_complex_last_dim(info: TensorInfo, what: str, where: str) -> None:
    """ShapeError unless ``info``'s last dim may be 1 (real) or 2 (complex)."""
    last = info.shape[-1] if info.shape else None
    if info.shape is not None and (not info.shape or (isinstance(last, int) and last not in (1, 2))):
        raise ShapeError(
            f"{where}: {what} of shape [..., 1 or 2] (real or complex) expected, got {info.format_shape()}"
        )


@layer_kind("DFT", DFTDescriptor, min_inputs=1, max_inputs=3)
def infer_dft(desc: DFTDescriptor, inputs, consts):
    where = "DFT"
    x = inputs[0]
    length_info = inputs[1] if len(inputs) > 1 else None
    axis_info = inputs[2] if len(inputs) > 2 else None
    expect_dtype(x, FLOAT_TYPES, f"{where} input")
    _expect_count_input(length_info, "dft_length", where)
    if axis_info is not None:
        if desc.opset < _FIRST_AXIS_INPUT_OPSET:
            raise GraphError(
                f"{where}: the axis input exists from opset {_FIRST_AXIS_INPUT_OPSET}; "
                f"opset {desc.opset} takes the axis attribute"
            )
        expect_dtype(axis_info, frozenset({DataType.INT64}), f"{where} input axis")
        expect_one_value(axis_info, "axis", where)
    _expect_complex_last_dim(x, "an input", where)
    if x.shape is None:
        return [TensorInfo(None, x.dtype)]
    if len(x.shape) < 2:
        raise ShapeError(
            f"{where}: an input of rank 2 or more (a signal dim and a last dim of 1 or 2) expected, got {x.format_shape()}"
        )
    given = count_value(consts[1] if len(consts) > 1 else None, "dft_length", where, 1)
    dims = list(x.shape[:-1])
    axis_value = count_value(consts[2], "axis", where, -len(x.shape)) if axis_info is not None else None
    if axis_info is not None and axis_value is None:
        # Which dim is transformed is known only when the layer runs.
        keeps_size = length_info is None and not desc.onesided
        dims = dims if keeps_size else [None] * len(dims)
    else:
        axis = dft_axis(desc, axis_value, len(x.shape))
        dims[axis] = _dft_axis_dim(desc, dims[axis], given, length_info is not None)
    return [TensorInfo((*dims, desc.output_channels), x.dtype)]


# --------------------------------------------------------------------------------------- STFT


@attrs.frozen
class STFTDescriptor:
    """STFT: the DFT of each frame of a [batch, length, 1 or 2] signal, frames ``frame_step``
    apart, each weighted by the window input (absent: ones). The DFT's length is the
    frame_length input, else the window's, else the signal's; a window of another length
    than it is cut or zero-padded to it, as in onnx's reference. ``onesided`` 1 (default):
    only the first length // 2 + 1 bins. The output is [batch, frames, bins, 2]."""

    onesided: int = attrs.field(default=1, validator=attrs.validators.in_((0, 1)))


def stft_frames(signal_length: int, frame_length: int, frame_step: int) -> int:
    """How many frames of ``frame_length``, ``frame_step`` apart, fit in the signal;
    ShapeError when not one does."""
    if frame_length > signal_length:
        raise ShapeError(
            f"STFT: a frame length of at most the signal's length {signal_length} expected, got {frame_length}"
        )
    return 1 + (signal_length - frame_length) // frame_step


@layer_kind("STFT", STFTDescriptor, min_inputs=2, max_inputs=4)
def infer_stft(desc: STFTDescriptor, inputs, consts):
    where = "STFT"
    signal, step_info = inputs[0], inputs[1]
    window = inputs[2] if len(inputs) > 2 else None
    length_info = inputs[3] if len(inputs) > 3 else None
    expect_dtype(signal, FLOAT_TYPES, f"{where} input signal")
    _expect_count_input(step_info, "frame_step", where)
    _expect_count_input(length_info, "frame_length", where)
    expect_dims(signal, (None, None, None), "signal [batch, length, 1 or 2]", where)
    _expect_complex_last_dim(signal, "signal [batch, length, 1 or 2]", where)
    window_length: Dim = None
    if window is not None:
        if window.dtype != signal.dtype:
            raise DataTypeError(
                f"{where}: a window of the signal's type {signal.dtype.name.lower()} expected, "
                f"got {window.dtype.name.lower()}"
            )
        expect_dims(window, (None,), "window [length]", where)
        window_length = None if window.shape is None else window.shape[0]
    batch, signal_length = (None, None) if signal.shape is None else signal.shape[:2]
    step = count_value(consts[1], "frame_step", where, 1)
    given = count_value(consts[3] if len(consts) > 3 else None, "frame_length", where, 1)
    length = given if length_info is not None else window_length if window is not None else signal_length
    frames: Dim = None
    if isinstance(length, int) and isinstance(signal_length, int) and step is not None:
        frames = stft_frames(signal_length, length, step)
    bins = None if not isinstance(length, int) else (length // 2 + 1 if desc.onesided else length)
    return [TensorInfo((batch, frames, bins, 2), signal.dtype)]


# ------------------------------------------------------------------------------- the windows


@attrs.frozen
class WindowDescriptor:
    """HannWindow, HammingWindow, BlackmanWindow: a window of the size input's length, of
    the ONNX data type number ``output_datatype`` (default 1, float32). ``periodic`` 1
    (default): one period of a window one longer (for spectral analysis); 0: symmetric."""

    output_datatype: int = attrs.field(default=1, converter=_datatype_code)
    periodic: int = attrs.field(default=1, validator=attrs.validators.in_((0, 1)))

    @property
    def dtype(self) -> DataType:
        """The output's data type."""
        return onnx_dtype_to_datatype(self.output_datatype)


@layer_kind(("HannWindow", "HammingWindow", "BlackmanWindow"), WindowDescriptor)
def infer_window(desc: WindowDescriptor, inputs, consts):
    _expect_count_input(inputs[0], "size", "window function")
    return [TensorInfo((count_value(consts[0], "size", "window function", 0),), desc.dtype)]


# ---------------------------------------------------------------------------- MelWeightMatrix


@attrs.frozen
class MelWeightMatrixDescriptor:
    """MelWeightMatrix: the [dft_length // 2 + 1, num_mel_bins] matrix that maps a one-sided
    spectrum's bins to triangular mel-scale bins between the lower and upper edge (Hz), of
    the ONNX data type number ``output_datatype`` (default 1, float32)."""

    output_datatype: int = attrs.field(default=1, converter=_datatype_code)

    @property
    def dtype(self) -> DataType:
        """The output's data type."""
        return onnx_dtype_to_datatype(self.output_datatype)


def check_mel_edges(lower: float, upper: float, sample_rate: int) -> None:
    """ShapeError unless 0 <= lower < upper <= the Nyquist frequency (sample_rate / 2)."""
    if not 0 <= lower < upper <= sample_rate / 2:
        raise ShapeError(
            f"MelWeightMatrix: 0 <= lower_edge_hertz < upper_edge_hertz <= sample_rate / 2 "
            f"({sample_rate / 2}) expected, got {lower} and {upper}"
        )


@layer_kind("MelWeightMatrix", MelWeightMatrixDescriptor, min_inputs=5, max_inputs=5)
def infer_mel_weight_matrix(desc: MelWeightMatrixDescriptor, inputs, consts):
    where = "MelWeightMatrix"
    for info, name in zip(inputs[:3], ("num_mel_bins", "dft_length", "sample_rate")):
        _expect_count_input(info, name, where)
    lower, upper = inputs[3], inputs[4]
    for info, name in ((lower, "lower_edge_hertz"), (upper, "upper_edge_hertz")):
        expect_dtype(info, FLOAT_TYPES, f"{where} input {name}")
        expect_one_value(info, name, where)
    if lower.dtype != upper.dtype:
        raise DataTypeError(
            f"{where}: lower_edge_hertz and upper_edge_hertz of one type expected, "
            f"got {lower.dtype.name.lower()} and {upper.dtype.name.lower()}"
        )
    mel_bins = count_value(consts[0], "num_mel_bins", where, 1)
    length = count_value(consts[1], "dft_length", where, 1)
    sample_rate = count_value(consts[2], "sample_rate", where, 1)
    if sample_rate is not None and consts[3] is not None and consts[4] is not None:
        check_mel_edges(float(np.asarray(consts[3]).item()), float(np.asarray(consts[4]).item()), sample_rate)
    return [TensorInfo((None if length is None else length // 2 + 1, mel_bins), desc.dtype)]
