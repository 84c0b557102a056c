"""CpuRef pooling against onnx's reference and against a per-pixel oracle, and pooling shape inference.

onnx's reference evaluator mishandles several pooling attributes (MaxPool Indices outside its
strided path, 1-D/3-D pads, SAME with dilations, ceil mode with a trailing window past the pads),
so the attribute sweep compares with ``_naive_pool`` below: one Python loop per output cell,
written straight from the ONNX formulas, sharing no code with the kernels.
"""

import itertools
import math

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from oracle import assert_matches_reference, run_flowrt_node

from flowrt.engine.graph.layer_kind import get_layer_kind
from flowrt.errors import DataTypeError, ModelLoadError, ShapeError
from flowrt.frontends.onnx.descriptors import make_descriptor
from flowrt.types import DataType, TensorInfo

RNG = np.random.default_rng(7)


def _axis(size, k, s, d, begin, end, auto_pad, ceil_mode):
    """Output size and leading pad along one axis, from the ONNX operator spec."""
    span = (k - 1) * d + 1
    if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        out = math.ceil(size / s)
        total = max(0, (out - 1) * s + span - size)
        begin = total // 2 if auto_pad == "SAME_UPPER" else (total + 1) // 2
        return out, begin, total - begin
    if auto_pad == "VALID":
        begin = end = 0
    rounding = math.ceil if ceil_mode else math.floor
    out = rounding((size + begin + end - span) / s) + 1
    if ceil_mode and (out - 1) * s >= size + begin:
        out -= 1
    return out, begin, end


def _naive_pool(
    op,
    x,
    kernel,
    strides,
    dilations,
    pads,
    auto_pad="NOTSET",
    ceil_mode=0,
    count_include_pad=0,
    p=2,
    storage_order=0,
):
    spatial = x.shape[2:]
    rank = len(spatial)
    axes = [
        _axis(spatial[i], kernel[i], strides[i], dilations[i], pads[i], pads[rank + i], auto_pad, ceil_mode)
        for i in range(rank)
    ]
    out_shape = (*x.shape[:2], *(a[0] for a in axes))
    y = np.zeros(out_shape, dtype=np.float64)
    index = np.zeros(out_shape, dtype=np.int64)
    for n, c, *o in itertools.product(*(range(d) for d in out_shape)):
        cells = [
            [o[i] * strides[i] - axes[i][1] + k * dilations[i] for k in range(kernel[i])] for i in range(rank)
        ]
        window = list(itertools.product(*cells))
        real = [q for q in window if all(0 <= q[i] < spatial[i] for i in range(rank))]
        padded = [
            q for q in window if all(-axes[i][1] <= q[i] < spatial[i] + axes[i][2] for i in range(rank))
        ]
        assume(real)  # A window of padding alone (dilation skipping a tiny input) has no defined value.
        values = [float(x[(n, c, *q)]) for q in real]
        if op == "MaxPool":
            best = int(np.argmax(values))
            y[(n, c, *o)] = values[best]
            order = "C" if storage_order == 0 else "F"
            flat = np.ravel_multi_index(real[best], spatial, order=order)
            index[(n, c, *o)] = (n * x.shape[1] + c) * int(np.prod(spatial)) + flat
        elif op == "AveragePool":
            y[(n, c, *o)] = sum(values) / (len(padded) if count_include_pad else len(real))
        else:
            y[(n, c, *o)] = sum(abs(v) ** p for v in values) ** (1 / p)
    return y.astype(x.dtype), index


@st.composite
def windows(draw, max_rank=3):
    """A pooling input and window attributes whose every window fits."""
    rank = draw(st.integers(1, max_rank))
    spatial = draw(st.lists(st.integers(1, 6), min_size=rank, max_size=rank))
    kernel = draw(st.lists(st.integers(1, 3), min_size=rank, max_size=rank))
    strides = draw(st.lists(st.integers(1, 3), min_size=rank, max_size=rank))
    dilations = draw(st.lists(st.integers(1, 2), min_size=rank, max_size=rank))
    pads = [draw(st.integers(0, k - 1)) for k in kernel * 2]
    auto_pad = draw(st.sampled_from(["NOTSET", "NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID"]))
    ceil_mode = draw(st.integers(0, 1))
    for i in range(rank):
        span = (kernel[i] - 1) * dilations[i] + 1
        room = spatial[i] + (0 if auto_pad == "VALID" else pads[i] + pads[rank + i])
        assume(auto_pad.startswith("SAME") or room >= span)
    x = RNG.standard_normal((2, 3, *spatial)).astype(np.float32)
    attributes = {
        "kernel_shape": kernel,
        "strides": strides,
        "dilations": dilations,
        "auto_pad": auto_pad,
        "ceil_mode": ceil_mode,
    }
    if auto_pad == "NOTSET":
        attributes["pads"] = pads
    return x, attributes


def _check_against_naive(op, x, attributes, num_outputs=1, **naive_options):
    got, infos = run_flowrt_node(op, [x], attributes, num_outputs=num_outputs)
    rank = x.ndim - 2
    a = attributes
    expected, index = _naive_pool(
        op,
        x,
        a["kernel_shape"],
        a["strides"],
        a["dilations"],
        a.get("pads", [0] * 2 * rank),
        a["auto_pad"],
        a["ceil_mode"],
        **naive_options,
    )
    assert got[0].dtype == x.dtype and got[0].shape == expected.shape
    np.testing.assert_allclose(got[0], expected, rtol=1e-5, atol=1e-6)
    assert all(info.shape == expected.shape for info in infos)
    return got, index


@settings(max_examples=25, deadline=None)
@given(windows(), st.integers(0, 1))
def test_max_pool_values_and_indices_match_per_pixel_oracle(case, storage_order):
    x, attributes = case
    attributes["storage_order"] = storage_order
    got, index = _check_against_naive("MaxPool", x, attributes, num_outputs=2, storage_order=storage_order)
    assert got[1].dtype == np.int64
    np.testing.assert_array_equal(got[1], index)


@settings(max_examples=25, deadline=None)
@given(windows(), st.integers(0, 1))
def test_average_pool_with_and_without_pad_cells_matches_per_pixel_oracle(case, count_include_pad):
    x, attributes = case
    attributes["count_include_pad"] = count_include_pad
    _check_against_naive("AveragePool", x, attributes, count_include_pad=count_include_pad)


@settings(max_examples=25, deadline=None)
@given(windows(), st.sampled_from([1, 2, 3]))
def test_lp_pool_matches_per_pixel_oracle(case, p):
    x, attributes = case
    attributes["p"] = p
    _check_against_naive("LpPool", x, attributes, p=p)


@settings(max_examples=25, deadline=None)
@given(
    st.integers(3, 7),
    st.integers(3, 7),
    st.integers(1, 3),
    st.integers(1, 3),
    st.integers(0, 1),
    st.sampled_from(["AveragePool", "LpPool", "MaxPool"]),
)
def test_2d_pools_with_symmetric_pads_match_reference(h, w, k, s, pad, op):
    x = RNG.standard_normal((1, 2, h, w)).astype(np.float32)
    attributes = {"kernel_shape": [k, k], "strides": [s, s]}
    if op != "MaxPool":  # onnx's MaxPool reads 2-D pads wrongly when strides are 1.
        attributes["pads"] = [min(pad, k - 1)] * 4
    if op == "AveragePool":
        attributes["count_include_pad"] = pad
    assert_matches_reference(op, [x], attributes)


def test_max_pool_indices_match_reference_on_its_strided_path():
    x = RNG.standard_normal((2, 3, 7, 6)).astype(np.float32)
    for storage_order in (0, 1):
        attributes = {
            "kernel_shape": [3, 2],
            "strides": [2, 2],
            "pads": [1, 0, 1, 1],
            "storage_order": storage_order,
        }
        assert_matches_reference("MaxPool", [x], attributes, num_outputs=2)


@pytest.mark.parametrize("dtype", [np.int8, np.uint8])
def test_max_pool_of_8_bit_integers_pads_with_the_lowest_value(dtype):
    info = np.iinfo(dtype)
    x = RNG.integers(info.min, info.max, (1, 2, 5, 5), endpoint=True).astype(dtype)
    x[0, 0, 0, 0] = info.min
    got = assert_matches_reference(
        "MaxPool", [x], {"kernel_shape": [2, 2], "strides": [2, 2], "ceil_mode": 1}
    )
    assert got[0].dtype == dtype


def test_average_pool_of_float16_matches_reference():
    x = RNG.standard_normal((1, 3, 6, 6)).astype(np.float16)
    assert_matches_reference(
        "AveragePool", [x], {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1]}, rtol=1e-3, atol=1e-3
    )


@pytest.mark.parametrize("spatial", [(5,), (4, 3), (2, 3, 4)])
def test_global_average_pool_matches_reference(spatial):
    x = RNG.standard_normal((2, 3, *spatial)).astype(np.float32)
    assert_matches_reference("GlobalAveragePool", [x])


@pytest.mark.parametrize("spatial", [(5,), (4, 3), (2, 3, 4)])
def test_global_max_pool_keeps_one_cell_per_channel(spatial):
    # onnx's reference reduces the wrong axes unless there are 2 spatial dims, so compare with numpy.
    x = RNG.standard_normal((2, 3, *spatial)).astype(np.float32)
    (got,), infos = run_flowrt_node("GlobalMaxPool", [x])
    np.testing.assert_array_equal(got, x.reshape(2, 3, -1).max(axis=2).reshape(2, 3, *([1] * len(spatial))))
    assert infos[0].shape == got.shape


@pytest.mark.parametrize("p", [1, 2, 3])
def test_global_lp_pool_is_the_p_norm_over_space(p):
    x = RNG.standard_normal((2, 3, 4, 5)).astype(np.float32)
    (got,), infos = run_flowrt_node("GlobalLpPool", [x], {"p": p})
    expected = (np.abs(x.astype(np.float64)) ** p).sum(axis=(2, 3), keepdims=True) ** (1 / p)
    np.testing.assert_allclose(got, expected, rtol=1e-5)
    assert got.dtype == np.float32 and infos[0].shape == (2, 3, 1, 1)


def _infer(op, shape, dtype=DataType.FLOAT32, num_outputs=1, **attributes):
    desc = make_descriptor(op, attributes, opset=21, num_outputs=num_outputs)
    return get_layer_kind(op).infer(desc, [TensorInfo(shape, dtype)], [None])


def test_infer_keeps_batch_and_channels_and_leaves_unknown_spatial_dims_unknown():
    out = _infer("MaxPool", ("N", None, 8, None), num_outputs=2, kernel_shape=[2, 2], strides=[2, 2])
    assert [o.shape for o in out] == [("N", None, 4, None), ("N", None, 4, None)]
    assert out[1].dtype == DataType.INT64
    assert _infer("AveragePool", None, kernel_shape=[3, 3])[0].shape == (None, None, None, None)
    assert _infer("LpPool", ("N", 3, "H", 9), kernel_shape=[3, 3], auto_pad="SAME_UPPER", strides=[2, 2])[
        0
    ].shape == ("N", 3, None, 5)
    assert _infer("GlobalAveragePool", (None, 4, "H", "W"))[0].shape == (None, 4, 1, 1)
    assert _infer("GlobalMaxPool", None)[0].shape is None


def test_ceil_mode_drops_a_last_window_that_would_start_in_the_trailing_pad():
    # size 5, kernel 2, stride 2: ceil((5 - 2) / 2) + 1 = 3 windows (floor: 2), starting at 0, 2, 4.
    assert _infer("MaxPool", (1, 1, 5), kernel_shape=[2], strides=[2], ceil_mode=1)[0].shape == (1, 1, 3)
    assert _infer("MaxPool", (1, 1, 5), kernel_shape=[2], strides=[2])[0].shape == (1, 1, 2)
    # size 4, kernel 1, stride 2, pads (0, 1): the 3rd window would start at 4, inside the trailing pad.
    assert _infer("MaxPool", (1, 1, 4), kernel_shape=[1], strides=[2], pads=[0, 1], ceil_mode=1)[0].shape == (
        1,
        1,
        2,
    )


def test_bad_pool_shapes_and_types_raise():
    with pytest.raises(ShapeError, match="does not fit"):
        _infer("MaxPool", (1, 1, 2, 2), kernel_shape=[3, 3])
    with pytest.raises(ShapeError, match="kernel_shape"):
        _infer("AveragePool", (1, 1, 4, 4, 4), kernel_shape=[2, 2])
    with pytest.raises(ShapeError, match="rank >= 3"):
        _infer("GlobalAveragePool", (4, 4))
    with pytest.raises(ShapeError, match="pads must have 4 entries"):
        _infer("MaxPool", (1, 1, 4, 4), kernel_shape=[2, 2], pads=[1, 1])
    with pytest.raises(DataTypeError, match="int32"):
        _infer("AveragePool", (1, 1, 4, 4), DataType.INT32, kernel_shape=[2, 2])
    with pytest.raises(ModelLoadError, match="kernel_shape"):
        make_descriptor("MaxPool", {}, opset=21, num_outputs=1)
    with pytest.raises(ModelLoadError, match="auto_pad"):
        make_descriptor("MaxPool", {"kernel_shape": (2,), "auto_pad": "SAME"}, opset=21, num_outputs=1)
