"""CpuRef Resize and Upsample against onnx's reference, and their shape inference."""

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from oracle import assert_matches_reference, run_flowrt_node, run_onnx_reference

from flowrt.engine.graph.layer_kind import get_layer_kind
from flowrt.engine.graph.layers.resize import ResizeDescriptor, resize_plan
from flowrt.engine.graph.layers.resize_coordinates import source_coordinates
from flowrt.errors import ModelLoadError, ShapeError
from flowrt.frontends.onnx.descriptors import make_descriptor
from flowrt.types import DataType, TensorInfo

COORDINATE_MODES = [
    "half_pixel",
    "half_pixel_symmetric",
    "pytorch_half_pixel",
    "align_corners",
    "asymmetric",
    "tf_crop_and_resize",
]
NEAREST_MODES = ["round_prefer_floor", "round_prefer_ceil", "floor", "ceil"]
EMPTY = np.zeros(0, dtype=np.float32)
scale_values = st.sampled_from([0.25, 0.5, 0.6, 0.75, 1.0, 1.5, 2.0, 2.5, 3.0])


def _infer(inputs, consts, opset=19, **attributes):
    desc = make_descriptor("Resize", attributes, opset=opset, num_outputs=1)
    return get_layer_kind("Resize").infer(desc, inputs, consts)[0]


def _attributes(data, mode):
    coordinates = data.draw(st.sampled_from(COORDINATE_MODES))
    attributes = {"mode": mode, "coordinate_transformation_mode": coordinates}
    if mode == "nearest":
        attributes["nearest_mode"] = data.draw(st.sampled_from(NEAREST_MODES))
    else:
        attributes["antialias"] = data.draw(st.sampled_from([0, 1]))
    if mode == "cubic":
        attributes["exclude_outside"] = data.draw(st.sampled_from([0, 1]))
        attributes["cubic_coeff_a"] = data.draw(st.sampled_from([-0.5, -0.75]))
    if coordinates == "tf_crop_and_resize":
        attributes["extrapolation_value"] = data.draw(st.sampled_from([0.0, -3.0]))
    return attributes


def _roi(data, rank, attributes):
    if attributes["coordinate_transformation_mode"] != "tf_crop_and_resize":
        return EMPTY
    starts = [data.draw(st.sampled_from([-0.2, 0.0, 0.1, 0.4])) for _ in range(rank)]
    ends = [data.draw(st.sampled_from([0.6, 0.9, 1.0, 1.2])) for _ in range(rank)]
    return np.array(starts + ends, dtype=np.float32)


def _reference_splits_a_tie(attributes, shape, sizes) -> bool:
    """True where onnx's reference resolves a near-integer coordinate two ways.

    A source coordinate a rounding error away from an integer (``1.1e-16`` for ``0``) gets
    its weights from the unpadded value but its taps from the value plus a pad, where the
    error vanishes; with antialias's wide kernel the taps are then off by one. flowrt
    reads weights and taps from the same value (see the test of such a case below).
    """
    if not attributes.get("antialias"):
        return False
    desc = ResizeDescriptor(**attributes)
    out_shape, factors, _ = resize_plan(desc, shape, None, None, sizes)
    for length, out_len, factor in zip(shape, out_shape, factors, strict=True):
        if out_len != length or factor != 1.0:
            x = source_coordinates(desc, out_len, length, factor, (0.0, 1.0))
            off = np.abs(x - np.rint(x))
            if np.any((off > 0) & (off < 1e-9)):
                return True
    return False


@settings(max_examples=25, deadline=None)
@given(
    st.lists(st.integers(1, 6), min_size=1, max_size=4),
    st.sampled_from(["nearest", "linear", "cubic"]),
    st.data(),
)
def test_resize_by_scales_every_mode_matches_reference(dims, mode, data):
    attributes = _attributes(data, mode)
    x = np.random.default_rng(5).standard_normal(dims).astype(np.float32)
    scales = np.array([data.draw(scale_values) for _ in dims], dtype=np.float32)
    assume(all(int(d * s) > 0 for d, s in zip(dims, scales, strict=True)))  # no empty outputs
    roi = _roi(data, len(dims), attributes)
    # One float32 pass per axis; the reference works in float64. Cubic's four taps overshoot,
    # so its rounding grows with the number of axes (1.5e-5 seen on four resized axes).
    atol = 1e-5 * len(dims) if mode == "cubic" else 1e-5
    assert_matches_reference("Resize", [x, roi, scales], attributes, opset=19, atol=atol)


@settings(max_examples=25, deadline=None)
@given(
    st.lists(st.integers(1, 6), min_size=2, max_size=4),
    st.sampled_from(["nearest", "linear", "cubic"]),
    st.data(),
)
def test_resize_to_sizes_on_chosen_axes_with_aspect_policy_matches_reference(dims, mode, data):
    attributes = _attributes(data, mode)
    axes = data.draw(st.lists(st.integers(0, len(dims) - 1), min_size=1, unique=True))
    attributes["axes"] = axes
    attributes["keep_aspect_ratio_policy"] = data.draw(
        st.sampled_from(["stretch", "not_larger", "not_smaller"])
    )
    sizes = np.array([data.draw(st.integers(1, 9)) for _ in axes], dtype=np.int64)
    x = np.arange(np.prod(dims), dtype=np.float32).reshape(dims)
    roi = _roi(data, len(axes), attributes)
    roi = roi if roi.size else None
    if roi is None:
        assume(not _reference_splits_a_tie(attributes, dims, sizes))
    assert_matches_reference("Resize", [x, roi, None, sizes], attributes, opset=19, atol=1e-4)


def test_antialias_weights_and_taps_come_from_one_coordinate():
    # Height 3 -> 2 at scale 0.5 (not_larger against width 2 -> 1): the first row's source
    # coordinate is 0 up to rounding, so the stretched linear kernel weighs rows -1, 0, 1
    # (edge-padded) by 1/4, 1/2, 1/4; the width was first averaged to 0.5, 2.5, 4.5.
    attributes = {
        "mode": "linear",
        "antialias": 1,
        "coordinate_transformation_mode": "half_pixel_symmetric",
        "axes": [2, 1],
        "keep_aspect_ratio_policy": "not_larger",
    }
    x = np.arange(6, dtype=np.float32).reshape(1, 3, 2)
    sizes = np.array([1, 2], dtype=np.int64)
    assert _reference_splits_a_tie(attributes, x.shape, sizes)
    (got,), _ = run_flowrt_node("Resize", [x, None, None, sizes], attributes, opset=19)
    np.testing.assert_allclose(got, [[[0.25 * 0.5 + 0.5 * 0.5 + 0.25 * 2.5], [4.0]]], rtol=1e-6)


def test_resize_of_integers_rounds_and_saturates_like_reference():
    x = np.array([[[[0, 255], [255, 0]]]], dtype=np.uint8)
    scales = np.array([1, 1, 2.5, 2.5], dtype=np.float32)
    assert_matches_reference("Resize", [x, EMPTY, scales], {"mode": "cubic"}, opset=13)


@settings(max_examples=25, deadline=None)
@given(
    st.integers(1, 5), st.integers(1, 5), st.sampled_from([1.0, 2.0, 3.0]), st.sampled_from([1.0, 2.0, 3.0])
)
def test_upsample_nearest_with_scales_input_matches_reference(h, w, sh, sw):
    x = np.arange(2 * h * w, dtype=np.float32).reshape(1, 2, h, w)
    scales = np.array([1, 1, sh, sw], dtype=np.float32)
    expected = assert_matches_reference("Upsample", [x, scales], opset=9)
    (got,), _ = run_flowrt_node("Upsample", [x], {"scales": scales.tolist()}, opset=7)
    np.testing.assert_array_equal(got, expected[0])
    (got,), _ = run_flowrt_node("Resize", [x, scales], opset=10)
    np.testing.assert_array_equal(got, expected[0])


@settings(max_examples=25, deadline=None)
@given(st.integers(1, 5), st.integers(1, 5), st.sampled_from([1.0, 1.5, 2.0, 3.0]))
def test_upsample_linear_is_asymmetric_linear_resize(h, w, scale):
    x = np.random.default_rng(6).standard_normal((1, 1, h, w)).astype(np.float32)
    scales = np.array([1, 1, scale, scale], dtype=np.float32)
    attributes = {"mode": "linear", "coordinate_transformation_mode": "asymmetric"}
    (expected,) = run_onnx_reference("Resize", [x, EMPTY, scales], attributes, opset=13)
    (got,), (info,) = run_flowrt_node("Upsample", [x, scales], {"mode": "linear"}, opset=9)
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)
    (got,), _ = run_flowrt_node(
        "Upsample", [x], {"mode": "bilinear", "height_scale": scale, "width_scale": scale}, opset=1
    )
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)
    assert info.shape == expected.shape


def test_resize_of_opset_10_rounds_up_when_shrinking():
    x = np.arange(8, dtype=np.float32).reshape(1, 1, 1, 8)
    (got,), _ = run_flowrt_node("Resize", [x, np.array([1, 1, 1, 0.6], np.float32)], opset=10)
    np.testing.assert_array_equal(got.ravel(), x.ravel()[np.ceil(np.arange(4) / 0.6).astype(int)])


def test_infer_gives_sizes_scaled_dims_or_rank():
    x = TensorInfo(("N", 3, 10, None))
    scales, sizes = TensorInfo((4,)), TensorInfo((4,), DataType.INT64)
    by_scales = _infer([x, None, scales], [None, None, np.array([1, 1, 1.5, 2], np.float32)])
    assert by_scales.shape == ("N", 3, 15, None)
    by_sizes = _infer([x, None, None, sizes], [None, None, None, np.array([1, 3, 4, 4])])
    assert by_sizes.shape == (1, 3, 4, 4)
    assert _infer([x, None, scales], [None, None, None]).shape == (None,) * 4
    kept = _infer(
        [x, None, None, TensorInfo((1,), DataType.INT64)],
        [None] * 3 + [np.array([5])],
        axes=[2],
        keep_aspect_ratio_policy="not_larger",
    )
    assert kept.shape == ("N", 3, 5, None)
    assert _infer([TensorInfo(None), None, scales], [None] * 3).shape is None


def test_bad_resize_inputs_raise():
    x = TensorInfo((1, 3, 4, 4))
    with pytest.raises(ShapeError, match="exactly one of scales and sizes"):
        _infer(
            [x, None, TensorInfo((4,)), TensorInfo((4,), DataType.INT64)],
            [None, None, np.ones(4, np.float32), np.ones(4, np.int64)],
        )
    with pytest.raises(ShapeError, match="4 values expected"):
        _infer([x, None, TensorInfo((2,))], [None, None, np.ones(2, np.float32)])
    with pytest.raises(ShapeError, match="scales must be > 0"):
        _infer([x, None, TensorInfo((4,))], [None, None, np.array([1, 1, 0, 1], np.float32)])
    with pytest.raises(ModelLoadError, match="coordinate_transformation_mode"):
        make_descriptor("Resize", {"coordinate_transformation_mode": "diagonal"}, opset=13, num_outputs=1)
