"""CpuRef DFT, STFT, window functions and MelWeightMatrix against onnx's reference, their
shape inference and errors, and a model through the public API against onnxruntime."""

import numpy as np
import onnxruntime as ort
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper
from oracle import assert_matches_reference

import flowrt
from flowrt.engine.graph.layer_kind import get_layer_kind
from flowrt.engine.graph.layers.signal import DFTDescriptor, STFTDescriptor, WindowDescriptor
from flowrt.errors import DataTypeError, GraphError, ModelLoadError, ShapeError
from flowrt.frontends.onnx.descriptors import make_descriptor
from flowrt.types import DataType, TensorInfo
from flowrt.workers.cpu.ref.kernels import load_all

F32, I64 = DataType.FLOAT32, DataType.INT64
DTYPES = st.sampled_from([np.float32, np.float64, np.float16])


def _tolerance(dtype) -> dict[str, float]:
    return {"rtol": 2e-3, "atol": 2e-3} if dtype == np.float16 else {"rtol": 1e-5, "atol": 1e-5}


@settings(max_examples=25, deadline=None)
@given(
    seed=st.integers(0, 2**31 - 1),
    dims=st.lists(st.integers(1, 5), min_size=1, max_size=3),
    channels=st.sampled_from([1, 2]),
    opset=st.sampled_from([17, 20]),
    inverse=st.sampled_from([0, 1]),
    onesided=st.sampled_from([0, 1]),
    length=st.one_of(st.none(), st.integers(1, 8)),
    axis_pick=st.integers(0, 5),
    negative_axis=st.booleans(),
    dtype=DTYPES,
)
def test_dft_matches_reference(
    seed, dims, channels, opset, inverse, onesided, length, axis_pick, negative_axis, dtype
):
    rank = len(dims) + 1
    axis = axis_pick % len(dims)
    if inverse and onesided and length is None and dims[axis] < 2:
        length = 4  # the default 2 * (size - 1) would be 0
    x = np.random.default_rng(seed).standard_normal((*dims, channels)).astype(dtype)
    axis_value = axis - rank if negative_axis else axis
    attributes = {"inverse": inverse, "onesided": onesided}
    inputs = [x, None if length is None else np.array(length, np.int64)]
    if opset == 17:
        attributes["axis"] = axis_value
    else:
        inputs.append(np.array(axis_value, np.int64))
    (y,) = assert_matches_reference("DFT", inputs, attributes, opset=opset, **_tolerance(dtype))
    assert y.shape[-1] == (1 if inverse and onesided else 2)


def test_dft_of_a_signal_then_its_inverse_gives_the_signal_back():
    x = np.random.default_rng(0).standard_normal((2, 6, 2)).astype(np.float64)
    kernel = load_all()["DFT"]
    spectrum = kernel(DFTDescriptor(), x)
    np.testing.assert_allclose(kernel(DFTDescriptor(inverse=1), spectrum), x, atol=1e-12)
    half = kernel(DFTDescriptor(onesided=1), x[..., :1])
    assert half.shape == (2, 4, 2)
    np.testing.assert_allclose(kernel(DFTDescriptor(inverse=1, onesided=1), half), x[..., :1], atol=1e-12)


@settings(max_examples=25, deadline=None)
@given(
    seed=st.integers(0, 2**31 - 1),
    batch=st.integers(1, 2),
    signal_length=st.integers(4, 16),
    step=st.integers(1, 4),
    channels=st.sampled_from([1, 2]),
    window_length=st.one_of(st.none(), st.integers(2, 4)),
    frame_length=st.one_of(st.none(), st.integers(2, 4)),
    onesided=st.sampled_from([0, 1]),
    dtype=DTYPES,
)
def test_stft_matches_reference(
    seed, batch, signal_length, step, channels, window_length, frame_length, onesided, dtype
):
    rng = np.random.default_rng(seed)
    signal = rng.standard_normal((batch, signal_length, channels)).astype(dtype)
    window = None if window_length is None else rng.uniform(0, 1, window_length).astype(dtype)
    length = None if frame_length is None else np.array(frame_length, np.int64)
    inputs = [signal, np.array(step, np.int64), window, length]
    (y,) = assert_matches_reference("STFT", inputs, {"onesided": onesided}, opset=17, **_tolerance(dtype))
    assert y.ndim == 4 and y.shape[0] == batch


WINDOW_DTYPES = [TensorProto.FLOAT, TensorProto.DOUBLE, TensorProto.FLOAT16, TensorProto.INT32]


@pytest.mark.parametrize("kind", ["HannWindow", "HammingWindow", "BlackmanWindow"])
@settings(max_examples=12, deadline=None)
@given(
    size=st.integers(0, 20),
    periodic=st.sampled_from([0, 1]),
    output_datatype=st.sampled_from(WINDOW_DTYPES),
    size_dtype=st.sampled_from([np.int32, np.int64]),
)
def test_window_matches_reference(kind, size, periodic, output_datatype, size_dtype):
    attributes = {"periodic": periodic, "output_datatype": output_datatype}
    if size == 1 and not periodic:
        size = 2  # a symmetric window of 1 is 0 / 0 in the reference too
    rtol = 2e-3 if output_datatype == TensorProto.FLOAT16 else 1e-6
    (y,) = assert_matches_reference(kind, [np.array(size, size_dtype)], attributes, opset=17, rtol=rtol)
    assert y.shape == (size,)


@pytest.mark.parametrize(
    "mel_bins, length, rate, lower, upper, dtype, output_datatype",
    [
        (8, 16, 8192, 0.0, 4096.0, np.float32, TensorProto.FLOAT),
        (10, 64, 16000, 20.0, 8000.0, np.float32, TensorProto.DOUBLE),
        (3, 9, 100, 5.0, 40.0, np.float64, TensorProto.FLOAT),
        (40, 512, 22050, 125.0, 7600.0, np.float16, TensorProto.FLOAT16),
        (1, 4, 10, 0.0, 5.0, np.float32, TensorProto.INT64),
    ],
)  # fmt: skip
def test_mel_weight_matrix_matches_reference(mel_bins, length, rate, lower, upper, dtype, output_datatype):
    inputs = [np.array(v, np.int64) for v in (mel_bins, length, rate)]
    inputs += [np.array(lower, dtype), np.array(upper, dtype)]
    (y,) = assert_matches_reference("MelWeightMatrix", inputs, {"output_datatype": output_datatype}, opset=17)
    assert y.shape == (length // 2 + 1, mel_bins)


def _infer(kind, descriptor, infos, consts=None):
    return get_layer_kind(kind).infer(descriptor, infos, consts or [None] * len(infos))


def test_sizes_from_run_time_inputs_stay_unknown():
    x = TensorInfo(("B", 10, 2), F32)
    scalar = TensorInfo((), I64)
    assert _infer("DFT", DFTDescriptor(), [x, None, scalar])[0].shape == ("B", 10, 2)
    assert _infer("DFT", DFTDescriptor(onesided=1), [x, None, scalar])[0].shape == (None, None, 2)
    assert _infer("DFT", DFTDescriptor(opset=17), [x, scalar])[0].shape == ("B", None, 2)
    assert _infer("DFT", DFTDescriptor(opset=17, axis=0), [x])[0].shape == ("B", 10, 2)
    (stft,) = _infer("STFT", STFTDescriptor(), [TensorInfo((1, 20, 1), F32), scalar, TensorInfo((8,), F32)])
    assert stft.shape == (1, None, 5, 2)
    (window,) = _infer("HannWindow", WindowDescriptor(output_datatype=11), [scalar])
    assert window == TensorInfo((None,), DataType.FLOAT64)


def test_constant_sizes_give_static_shapes():
    x, scalar = TensorInfo((3, 8, 1), F32), TensorInfo((), I64)
    consts = [None, np.array(6), np.array(-2)]
    assert _infer("DFT", DFTDescriptor(onesided=1), [x, scalar, scalar], consts)[0].shape == (3, 4, 2)
    (stft,) = _infer("STFT", STFTDescriptor(onesided=0), [x, scalar], [None, np.array(2)])
    assert stft.shape == (3, 1, 8, 2)


X = TensorInfo((2, 8, 2), F32)
SCALAR = TensorInfo((), I64)


@pytest.mark.parametrize(
    "kind, descriptor, infos, consts, error, message",
    [
        ("DFT", DFTDescriptor(), [X, None, SCALAR], [None, None, np.array(-1)], ShapeError, r"axis in \[-3, -2\] or \[0, 1\] expected .* got -1"),
        ("DFT", DFTDescriptor(opset=17, axis=2), [X], [None], ShapeError, r"axis in \[-3, -2\] or \[0, 1\] expected .* got 2"),
        ("DFT", DFTDescriptor(), [TensorInfo((2, 8, 3), F32)], [None], ShapeError, r"\[\.\.\., 1 or 2\] .* got \(2, 8, 3\)"),
        ("DFT", DFTDescriptor(), [TensorInfo((2, 8, 2), I64)], [None], DataTypeError, "DFT input expects one of .*float32.*, got int64"),
        ("DFT", DFTDescriptor(), [X, SCALAR], [None, np.array(0)], ShapeError, "dft_length of at least 1 expected, got 0"),
        ("DFT", DFTDescriptor(inverse=1, onesided=1), [TensorInfo((1, 2), F32)], [None], ShapeError, "axis of size 1 gives a transform of length 0"),
        ("DFT", DFTDescriptor(opset=17), [X, None, SCALAR], [None, None, None], GraphError, "axis input exists from opset 20"),
        ("STFT", STFTDescriptor(), [X, SCALAR, None, SCALAR], [None, np.array(1), None, np.array(9)], ShapeError, "frame length of at most the signal's length 8 expected, got 9"),
        ("STFT", STFTDescriptor(), [X, SCALAR], [None, np.array(0)], ShapeError, "frame_step of at least 1 expected, got 0"),
        ("STFT", STFTDescriptor(), [X, SCALAR, TensorInfo((4,), DataType.FLOAT64)], [None] * 3, DataTypeError, "window of the signal's type float32 expected, got float64"),
        ("STFT", STFTDescriptor(), [TensorInfo((8, 2), F32), SCALAR], [None] * 2, ShapeError, r"signal \[batch, length, 1 or 2\] of shape \(\?, \?, \?\) expected, got \(8, 2\)"),
        ("STFT", STFTDescriptor(), [X, TensorInfo((2,), I64)], [None] * 2, ShapeError, "frame_step must be a scalar or hold one value"),
        ("HannWindow", WindowDescriptor(), [SCALAR], [np.array(-1)], ShapeError, "size of at least 0 expected, got -1"),
        ("HannWindow", WindowDescriptor(), [TensorInfo((), F32)], [None], DataTypeError, "size expects one of int32, int64, got float32"),
    ],
)  # fmt: skip
def test_bad_inputs_say_what_is_wrong(kind, descriptor, infos, consts, error, message):
    with pytest.raises(error, match=message):
        _infer(kind, descriptor, infos, consts)


@pytest.mark.parametrize(
    "kind, attributes, opset, message",
    [
        ("DFT", {"axis": 1}, 20, "axis as an input from opset 20"),
        ("DFT", {"onesided": 2}, 17, "onesided"),
        ("STFT", {"onesided": -1}, 17, "onesided"),
        ("HammingWindow", {"output_datatype": TensorProto.STRING}, 17, "numeric type expected, got string"),
        ("BlackmanWindow", {"periodic": 3}, 17, "periodic"),
        ("MelWeightMatrix", {"output_datatype": TensorProto.BOOL}, 17, "numeric type expected, got bool"),
    ],
)
def test_bad_attributes_fail_at_load(kind, attributes, opset, message):
    with pytest.raises(ModelLoadError, match=message):
        make_descriptor(kind, attributes, opset=opset, num_outputs=1, where="node 'n'")


def test_mel_weight_matrix_refuses_edges_past_nyquist():
    kernel = load_all()["MelWeightMatrix"]
    counts = [np.array(v, np.int64) for v in (4, 16, 1000)]
    with pytest.raises(ShapeError, match=r"<= sample_rate / 2 \(500.0\) expected, got 0.0 and 600.0"):
        kernel(
            make_descriptor("MelWeightMatrix", {}, opset=17, num_outputs=1),
            *counts,
            np.float32(0),
            np.float32(600),
        )


def test_signal_model_runs_through_the_public_api_like_onnxruntime():
    nodes = [
        helper.make_node("HannWindow", ["size"], ["window"]),
        helper.make_node("STFT", ["signal", "step", "window"], ["spectrogram"]),
        helper.make_node("DFT", ["signal", "length", "axis"], ["spectrum"], inverse=1),
    ]
    graph = helper.make_graph(
        nodes,
        "signal",
        [
            helper.make_tensor_value_info("signal", TensorProto.FLOAT, ("B", "T", 1)),
            helper.make_tensor_value_info("axis", TensorProto.INT64, ()),
        ],
        [
            helper.make_tensor_value_info("spectrogram", TensorProto.FLOAT, ("B", "F", 9, 2)),
            helper.make_tensor_value_info("spectrum", TensorProto.FLOAT, ("B", "N", 2)),
        ],
        [
            numpy_helper.from_array(np.array(16, np.int64), "size"),
            numpy_helper.from_array(np.array(8, np.int64), "step"),
            numpy_helper.from_array(np.array(40, np.int64), "length"),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)])
    model.ir_version = 9
    feeds = {
        "signal": np.random.default_rng(3).standard_normal((2, 64, 1)).astype(np.float32),
        "axis": np.array(1, np.int64),
    }
    got = flowrt.InferenceSession(model, backends=["CpuRef"]).run(None, feeds)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    expected = session.run(None, feeds)
    assert got[0].shape == (2, 7, 9, 2) and got[1].shape == (2, 40, 2)
    for g, e in zip(got, expected):
        np.testing.assert_allclose(g, e, rtol=1e-4, atol=1e-4)
