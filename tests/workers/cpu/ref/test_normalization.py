"""CpuRef normalization layers against onnx's reference, and their shape inference."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from oracle import assert_matches_reference, run_flowrt_node, run_onnx_reference

from flowrt.engine.graph.layer_kind import get_layer_kind
from flowrt.errors import ModelLoadError, ShapeError
from flowrt.frontends.onnx.descriptors import make_descriptor
from flowrt.types import DataType, TensorInfo

F32 = DataType.FLOAT32
image_shapes = st.lists(st.integers(1, 4), min_size=2, max_size=5)


def _infer(op, inputs, opset=21, num_outputs=1, **attributes):
    desc = make_descriptor(op, attributes, opset=opset, num_outputs=num_outputs)
    return get_layer_kind(op).infer(desc, inputs, [None] * len(inputs))


def _normal(shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def _batch_norm_inputs(shape, seed=0):
    c = shape[1]
    rng = np.random.default_rng(seed)
    params = [rng.standard_normal(c), rng.standard_normal(c), rng.standard_normal(c), rng.random(c) + 0.5]
    return [_normal(shape, seed), *(p.astype(np.float32) for p in params)]


@settings(max_examples=25, deadline=None)
@given(image_shapes, st.sampled_from([1e-5, 1e-2]))
def test_batch_normalization_inference_matches_reference(shape, epsilon):
    assert_matches_reference("BatchNormalization", _batch_norm_inputs(shape), {"epsilon": epsilon}, opset=15)


@pytest.mark.parametrize(
    ("opset", "attributes"),
    [
        (1, {"is_test": 1, "consumed_inputs": [0, 0, 0, 1, 1], "spatial": 1}),
        (6, {"is_test": 1}),
        (7, {"spatial": 1}),
        (9, {}),
    ],
)
def test_batch_normalization_legacy_opsets_infer_like_opset_15(opset, attributes):
    inputs = _batch_norm_inputs((2, 3, 4, 5))
    (expected,) = run_onnx_reference("BatchNormalization", inputs, {"momentum": 0.8}, opset=15)
    (got,), (info,) = run_flowrt_node(
        "BatchNormalization", inputs, {"momentum": 0.8, **attributes}, opset=opset
    )
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)
    assert info == TensorInfo((2, 3, 4, 5), F32)


def test_batch_normalization_per_activation_when_not_spatial():
    x = _normal((2, 3, 4), 1)
    scale, bias, mean = (_normal((3, 4), s) for s in (2, 3, 4))
    var = np.abs(_normal((3, 4), 5)) + 0.5
    (got,), _ = run_flowrt_node("BatchNormalization", [x, scale, bias, mean, var], {"spatial": 0}, opset=7)
    np.testing.assert_allclose(got, scale * (x - mean) / np.sqrt(var + 1e-5) + bias, rtol=1e-5, atol=1e-6)


def test_batch_normalization_training_mode_returns_updated_running_stats():
    inputs = _batch_norm_inputs((3, 2, 4), 2)
    assert_matches_reference("BatchNormalization", inputs, {"training_mode": 1}, opset=15, num_outputs=3)


def test_batch_normalization_extra_outputs_in_inference_are_the_running_stats():
    inputs = _batch_norm_inputs((2, 3, 2))
    outputs, infos = run_flowrt_node("BatchNormalization", inputs, {"is_test": 1}, opset=6, num_outputs=5)
    for got, given_stat in zip(outputs[1:], inputs[3:] * 2, strict=True):
        np.testing.assert_array_equal(got, given_stat)
    assert [i.shape for i in infos] == [(2, 3, 2), (3,), (3,), (3,), (3,)]


@settings(max_examples=25, deadline=None)
@given(image_shapes.filter(lambda s: len(s) >= 3), st.sampled_from([1e-5, 1e-1]))
def test_instance_normalization_matches_reference(shape, epsilon):
    x, scale, bias = _normal(shape), _normal(shape[1], 1), _normal(shape[1], 2)
    assert_matches_reference(
        "InstanceNormalization", [x, scale, bias], {"epsilon": epsilon}, opset=22, atol=1e-5
    )


@settings(max_examples=25, deadline=None)
@given(st.lists(st.integers(1, 4), min_size=1, max_size=4), st.data())
def test_layer_normalization_any_axis_and_outputs_matches_reference(shape, data):
    rank = len(shape)
    axis = data.draw(st.integers(-rank, rank - 1))
    start = axis % rank
    # Scale and bias cover a trailing part of the normalized dims (unidirectional broadcast).
    param_shape = shape[data.draw(st.integers(start, rank)) :]
    with_bias = data.draw(st.booleans())
    inputs = [_normal(shape), _normal(param_shape, 1), _normal(param_shape, 2) if with_bias else None]
    outputs = data.draw(st.integers(1, 3))
    got = assert_matches_reference(
        "LayerNormalization", inputs, {"axis": axis}, opset=17, num_outputs=outputs, atol=1e-5
    )
    assert len(got) == outputs


def test_layer_normalization_statistics_are_float32_for_float16_input():
    x = _normal((2, 6)).astype(np.float16)
    scale = np.ones(6, np.float16)
    outputs, infos = run_flowrt_node("LayerNormalization", [x, scale], num_outputs=3)
    assert [o.dtype for o in outputs] == [np.float16, np.float32, np.float32]
    assert [i.dtype for i in infos] == [DataType.FLOAT16, F32, F32]
    mean = x.astype(np.float32).mean(axis=1, keepdims=True)
    np.testing.assert_allclose(outputs[1], mean, rtol=1e-6)


@settings(max_examples=25, deadline=None)
@given(
    st.integers(1, 3), st.integers(1, 3), st.lists(st.integers(1, 4), max_size=2), st.sampled_from([18, 21])
)
def test_group_normalization_matches_reference(groups, per_group, spatial, opset):
    shape = [2, groups * per_group, *spatial]
    param = groups if opset == 18 else groups * per_group
    inputs = [_normal(shape), _normal(param, 1), _normal(param, 2)]
    assert_matches_reference("GroupNormalization", inputs, {"num_groups": groups}, opset=opset, atol=1e-5)


@settings(max_examples=25, deadline=None)
@given(st.lists(st.integers(1, 4), min_size=1, max_size=4), st.data())
def test_mean_variance_normalization_any_axes_matches_reference(shape, data):
    rank = len(shape)
    axes = data.draw(
        st.lists(st.integers(-rank, rank - 1), min_size=1, max_size=rank, unique_by=lambda a: a % rank)
    )
    assert_matches_reference(
        "MeanVarianceNormalization", [_normal(shape)], {"axes": axes}, opset=13, atol=1e-4, rtol=1e-4
    )


def test_mean_variance_normalization_default_axes_are_0_2_3():
    x = _normal((2, 3, 4, 5))
    (got,), _ = run_flowrt_node("MeanVarianceNormalization", [x], opset=13)
    np.testing.assert_allclose(got.mean(axis=(0, 2, 3)), 0.0, atol=1e-5)
    np.testing.assert_allclose(got.std(axis=(0, 2, 3)), 1.0, rtol=1e-5)


def _lrn_by_definition(x, size, alpha, beta, bias):
    """ONNX's LRN formula, one channel at a time."""
    c = x.shape[1]
    y = np.empty_like(x)
    for ch in range(c):
        lo, hi = max(0, ch - (size - 1) // 2), min(c - 1, ch + int(np.ceil((size - 1) / 2)))
        square_sum = np.sum(x[:, lo : hi + 1] ** 2, axis=1)
        y[:, ch] = x[:, ch] / (bias + alpha / size * square_sum) ** beta
    return y


@settings(max_examples=25, deadline=None)
@given(st.integers(1, 3), st.integers(1, 6), st.lists(st.integers(1, 3), max_size=2), st.integers(1, 6))
def test_lrn_follows_the_onnx_definition_for_odd_and_even_sizes(n, c, spatial, size):
    x = _normal([n, c, *spatial]) * 3
    attributes = {"size": size, "alpha": 0.5, "beta": 0.75, "bias": 2.0}
    (got,), _ = run_flowrt_node("LRN", [x], attributes, opset=13)
    np.testing.assert_allclose(got, _lrn_by_definition(x, size, 0.5, 0.75, 2.0), rtol=1e-5)


def test_lrn_matches_reference_on_square_batches():
    # onnx's reference loops over the batch dim for channels, so it is right only when N == C.
    x = _normal((4, 4, 3, 3)) * 3
    assert_matches_reference("LRN", [x], {"size": 3, "alpha": 0.1}, opset=13)


def test_lrn_needs_a_positive_size():
    with pytest.raises(ModelLoadError, match="size"):
        make_descriptor("LRN", {}, opset=13, num_outputs=1)
    with pytest.raises(ModelLoadError, match="size"):
        make_descriptor("LRN", {"size": 0}, opset=13, num_outputs=1)


def test_normalization_parameter_of_the_wrong_size_is_a_shape_error():
    x = TensorInfo((2, 3, 4, 4), F32)
    good, bad = TensorInfo((3,), F32), TensorInfo((4,), F32)
    with pytest.raises(ShapeError, match=r"scale of shape \(3,\) expected, got \(4,\)"):
        _infer("BatchNormalization", [x, bad, good, good, good], opset=15)
    with pytest.raises(ShapeError, match=r"B of shape \(3,\) expected"):
        _infer("InstanceNormalization", [x, good, bad])
    with pytest.raises(ShapeError, match="3 channels do not split into 2 groups"):
        _infer("GroupNormalization", [x, good, good], num_groups=2)
    with pytest.raises(ShapeError, match="does not broadcast"):
        _infer("LayerNormalization", [x, TensorInfo((3, 4), F32)])
    with pytest.raises(ShapeError, match="rank 2 or more"):
        _infer("LRN", [TensorInfo((3,), F32)], size=3)


def test_normalization_axis_out_of_range_is_a_shape_error():
    x = TensorInfo((2, 3), F32)
    with pytest.raises(ShapeError, match="out of range"):
        _infer("LayerNormalization", [x, TensorInfo((3,), F32)], axis=2)
    with pytest.raises(ShapeError, match="out of range"):
        _infer("MeanVarianceNormalization", [x], axes=[0, 2])


def test_normalization_infer_copes_with_unknown_dims_and_rank():
    x = TensorInfo((None, "C", 8, 8), F32)
    c = TensorInfo(("C",), F32)
    assert _infer("BatchNormalization", [x, c, c, c, c], opset=15) == [x]
    assert _infer("GroupNormalization", [x, c, c], num_groups=4) == [x]
    outputs = _infer("LayerNormalization", [x, TensorInfo((8,), F32), None], num_outputs=3, axis=2)
    assert [o.shape for o in outputs] == [x.shape, (None, "C", 1, 1), (None, "C", 1, 1)]
    unknown = TensorInfo(None, F32)
    assert _infer("LayerNormalization", [unknown, TensorInfo(None, F32)], num_outputs=2)[1].shape is None
    assert _infer("InstanceNormalization", [unknown, c, c]) == [unknown]
    assert _infer("LRN", [unknown], size=5) == [unknown]
