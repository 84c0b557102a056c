"""CpuRef Conv and ConvTranspose against onnx's reference, and their shape inference."""

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from oracle import assert_matches_reference, run_flowrt_node

from flowrt.engine.graph.layer_kind import get_layer_kind
from flowrt.errors import DataTypeError, ModelLoadError, ShapeError
from flowrt.frontends.onnx.descriptors import make_descriptor
from flowrt.types import DataType, TensorInfo

RNG = np.random.default_rng(3)
CONV_TOLERANCE = {"rtol": 1e-4, "atol": 1e-5}


def _normal(*shape, dtype=np.float32):
    return RNG.standard_normal(shape).astype(dtype)


def _lists(draw, rank, low, high):
    return draw(st.lists(st.integers(low, high), min_size=rank, max_size=rank))


@st.composite
def convolutions(draw):
    """Data, weights, optional bias and attributes of a Conv whose every window fits."""
    rank = draw(st.integers(1, 3))
    group = draw(st.sampled_from([1, 1, 2, 3]))
    c, m = group * draw(st.integers(1, 2)), group * draw(st.integers(1, 2))
    spatial, kernel = _lists(draw, rank, 1, 7), _lists(draw, rank, 1, 3)
    attributes = {"group": group, "strides": _lists(draw, rank, 1, 3), "dilations": _lists(draw, rank, 1, 2)}
    auto_pad = draw(st.sampled_from(["NOTSET", "NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID"]))
    pads = _lists(draw, 2 * rank, 0, 2)
    if auto_pad == "NOTSET":
        attributes["pads"] = pads
    else:
        attributes["auto_pad"] = auto_pad
    for i in range(rank):
        room = spatial[i] + (pads[i] + pads[rank + i] if auto_pad == "NOTSET" else 0)
        assume(auto_pad.startswith("SAME") or room >= (kernel[i] - 1) * attributes["dilations"][i] + 1)
    if draw(st.booleans()):
        attributes["kernel_shape"] = kernel
    inputs = [_normal(2, c, *spatial), _normal(m, c // group, *kernel)]
    if draw(st.booleans()):
        inputs.append(_normal(m))
    return inputs, attributes


@settings(max_examples=25, deadline=None)
@given(convolutions())
def test_conv_with_any_groups_pads_strides_dilations_and_auto_pad_matches_reference(case):
    inputs, attributes = case
    assert_matches_reference("Conv", inputs, attributes, **CONV_TOLERANCE)


def test_depthwise_conv_matches_reference():
    x, w, b = _normal(1, 6, 9, 9), _normal(12, 1, 3, 3), _normal(12)
    attributes = {"group": 6, "strides": [2, 2], "pads": [1, 1, 1, 1]}
    assert_matches_reference("Conv", [x, w, b], attributes, **CONV_TOLERANCE)


@pytest.mark.parametrize("dtype", [np.float16, np.float64])
def test_conv_keeps_half_and_double_precision(dtype):
    x, w = _normal(1, 3, 6, 6, dtype=dtype), _normal(4, 3, 3, 3, dtype=dtype)
    tolerance = {"rtol": 1e-2, "atol": 1e-2} if dtype == np.float16 else {"rtol": 1e-10, "atol": 1e-12}
    got = assert_matches_reference("Conv", [x, w], {"pads": [1, 1, 1, 1]}, **tolerance)
    assert got[0].dtype == dtype


def test_one_by_one_conv_is_a_matmul_over_channels():
    x, w = _normal(2, 5, 4, 3), _normal(7, 5, 1, 1)
    (got,), _ = run_flowrt_node("Conv", [x, w])
    np.testing.assert_allclose(got, np.einsum("mc,nchw->nmhw", w[:, :, 0, 0], x), rtol=1e-5, atol=1e-6)


@st.composite
def transposed_convolutions(draw):
    """Data, weights, optional bias and attributes of an ungrouped ConvTranspose."""
    rank = draw(st.integers(1, 3))
    c, m = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    spatial, kernel = _lists(draw, rank, 1, 4), _lists(draw, rank, 1, 3)
    strides, dilations = _lists(draw, rank, 1, 3), _lists(draw, rank, 1, 2)
    attributes = {"strides": strides, "dilations": dilations}
    mode = draw(st.sampled_from(["pads", "SAME_UPPER", "SAME_LOWER", "output_shape"]))
    full = [
        s * (n - 1) + (k - 1) * d + 1 for s, n, k, d in zip(strides, spatial, kernel, dilations, strict=True)
    ]
    if mode == "pads":
        attributes["pads"] = _lists(draw, 2 * rank, 0, 1)
        attributes["output_padding"] = [draw(st.integers(0, s - 1)) for s in strides]
        assume(all(f - attributes["pads"][i] - attributes["pads"][rank + i] > 0 for i, f in enumerate(full)))
    else:
        attributes["auto_pad"] = (
            mode if mode != "output_shape" else draw(st.sampled_from(["SAME_UPPER", "SAME_LOWER"]))
        )
    if mode == "output_shape":
        attributes["output_shape"] = [max(1, f - draw(st.integers(-1, 2))) for f in full]
    inputs = [_normal(2, c, *spatial), _normal(c, m, *kernel)]
    if draw(st.booleans()):
        inputs.append(_normal(m))
    return inputs, attributes


@settings(max_examples=25, deadline=None)
@given(transposed_convolutions())
def test_conv_transpose_with_pads_output_padding_and_auto_pad_matches_reference(case):
    inputs, attributes = case
    assert_matches_reference("ConvTranspose", inputs, attributes, **CONV_TOLERANCE)


@settings(max_examples=10, deadline=None)
@given(st.integers(2, 3), st.integers(1, 2), st.integers(1, 2), st.integers(1, 3))
def test_grouped_conv_transpose_equals_one_conv_transpose_per_group(group, c, m, stride):
    # onnx's reference fails on groups with more than one channel each, so compare with ungrouped runs.
    x, w, b = _normal(2, group * c, 3, 4), _normal(group * c, m, 2, 3), _normal(group * m)
    attributes = {"strides": [stride, 1], "pads": [1, 0, 0, 1]}
    (got,), infos = run_flowrt_node("ConvTranspose", [x, w, b], {**attributes, "group": group})
    parts = [
        run_flowrt_node(
            "ConvTranspose",
            [x[:, g * c : (g + 1) * c], w[g * c : (g + 1) * c], b[g * m : (g + 1) * m]],
            attributes,
        )[0][0]
        for g in range(group)
    ]
    np.testing.assert_allclose(got, np.concatenate(parts, axis=1), rtol=1e-6)
    assert infos[0].shape == got.shape


def test_conv_transpose_output_shape_without_auto_pad_puts_the_odd_pad_cell_first():
    # full size 2 * (4 - 1) + 3 = 9 per axis; output_shape (6, 8) crops 3 and 1 cells: pads begin (2, 1)
    # and end (1, 0) by the ONNX formula (onnx's reference evaluator cannot run this case).
    x, w = _normal(1, 2, 4, 4), _normal(2, 3, 3, 3)
    (got,), infos = run_flowrt_node("ConvTranspose", [x, w], {"strides": [2, 2], "output_shape": [6, 8]})
    (explicit,), _ = run_flowrt_node("ConvTranspose", [x, w], {"strides": [2, 2], "pads": [2, 1, 1, 0]})
    np.testing.assert_array_equal(got, explicit)
    assert got.shape == infos[0].shape == (1, 3, 6, 8)


def _infer(op, shapes, dtype=DataType.FLOAT32, **attributes):
    desc = make_descriptor(op, attributes, opset=21, num_outputs=1)
    infos = [TensorInfo(s, dtype) if s != "absent" else None for s in shapes]
    return get_layer_kind(op).infer(desc, infos, [None] * len(infos))[0]


def test_conv_infer_copes_with_unknown_and_symbolic_dims():
    assert _infer("Conv", [("N", 3, 224, None), (64, 3, 3, 3)], pads=[1, 1, 1, 1]).shape == (
        "N",
        64,
        224,
        None,
    )
    assert _infer("Conv", [None, (8, 3, 3, 3)]).shape == (None, 8, None, None)
    assert _infer("Conv", [None, None]).shape is None
    assert _infer("Conv", [(1, 3, 10, 10), (8, 3, None, None)], strides=[2, 2]).shape == (1, 8, None, None)
    assert _infer("Conv", [(1, 3, "H", 7), (8, 3, 3, 3)], auto_pad="SAME_UPPER", strides=[2, 2]).shape == (
        1,
        8,
        None,
        4,
    )
    assert _infer("ConvTranspose", [("N", 4, 5, 5), (4, 2, 3, 3)], group=2, strides=[2, 2]).shape == (
        "N",
        4,
        11,
        11,
    )
    assert _infer("ConvTranspose", [(1, 4, None, 5), (4, 2, None, 3)], output_shape=[9, 9]).shape == (
        1,
        2,
        9,
        9,
    )
    assert _infer("ConvTranspose", [None, (4, 2, 3)]).shape == (None, 2, None)


def test_conv_infer_rejects_mismatched_channels_ranks_kernels_and_bias():
    with pytest.raises(ShapeError, match="expects 6 input channels"):
        _infer("Conv", [(1, 4, 8, 8), (8, 3, 3, 3)], group=2)
    with pytest.raises(ShapeError, match="divisible by group 2"):
        _infer("Conv", [(1, 4, 8, 8), (5, 2, 3, 3)], group=2)
    with pytest.raises(ShapeError, match="weights of the data's rank 4"):
        _infer("Conv", [(1, 3, 8, 8), (8, 3, 3)])
    with pytest.raises(ShapeError, match="kernel_shape"):
        _infer("Conv", [(1, 3, 8, 8), (8, 3, 3, 3)], kernel_shape=[5, 5])
    with pytest.raises(ShapeError, match="bias of shape"):
        _infer("Conv", [(1, 3, 8, 8), (8, 3, 3, 3), (4,)])
    with pytest.raises(ShapeError, match="does not fit"):
        _infer("Conv", [(1, 3, 2, 8), (8, 3, 3, 3)])
    with pytest.raises(ShapeError, match="rank >= 3"):
        _infer("Conv", [(3, 8), (8, 3)])
    with pytest.raises(ShapeError, match="strides must have 2 entries"):
        _infer("Conv", [(1, 3, 8, 8), (8, 3, 3, 3)], strides=[1])
    with pytest.raises(ShapeError, match="expects weights of shape"):
        _infer("ConvTranspose", [(1, 3, 8, 8), (4, 3, 3, 3)])
    with pytest.raises(DataTypeError, match="int64"):
        _infer("Conv", [(1, 3, 8, 8), (8, 3, 3, 3)], DataType.INT64)
    with pytest.raises(ModelLoadError, match="auto_pad"):
        make_descriptor("Conv", {"auto_pad": "same"}, opset=21, num_outputs=1)
    with pytest.raises(ModelLoadError, match="strides"):
        make_descriptor("Conv", {"strides": (0, 1)}, opset=21, num_outputs=1)
