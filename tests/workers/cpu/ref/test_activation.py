"""CpuRef activation kernels and their shape inference, checked against onnx's reference."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import array_shapes
from oracle import assert_matches_reference, run_flowrt_node

from flowrt.engine.graph.layer_kind import get_layer_kind
from flowrt.errors import DataTypeError, ModelLoadError, ShapeError
from flowrt.frontends.onnx.descriptors import make_descriptor
from flowrt.types import DataType, TensorInfo

# Rank 1 and up: onnx's reference Softsign fails on 0-d inputs.
SHAPES = array_shapes(min_dims=1, max_dims=4, min_side=1, max_side=5)
SEEDS = st.integers(0, 2**31 - 1)
ALPHAS = st.floats(0.125, 3.0, width=32)

# Each activation with a strategy for its attributes (empty: it has none).
ACTIVATIONS = {
    "Relu": st.just({}),
    "LeakyRelu": st.fixed_dictionaries({}, optional={"alpha": ALPHAS}),
    "Elu": st.fixed_dictionaries({}, optional={"alpha": ALPHAS}),
    "Selu": st.fixed_dictionaries({}, optional={"alpha": ALPHAS, "gamma": ALPHAS}),
    "Celu": st.fixed_dictionaries({}, optional={"alpha": ALPHAS}),
    "ThresholdedRelu": st.fixed_dictionaries({}, optional={"alpha": st.floats(-1, 2, width=32)}),
    "HardSigmoid": st.fixed_dictionaries({}, optional={"alpha": ALPHAS, "beta": st.floats(-1, 1, width=32)}),
    "Gelu": st.fixed_dictionaries({}, optional={"approximate": st.sampled_from(["none", "tanh"])}),
    **{op: st.just({}) for op in ["Sigmoid", "HardSwish", "Tanh", "Softplus", "Softsign", "Mish"]},
}


def infer(op_type, infos, attributes=None, opset=21):
    """Run only the shape inference of ``op_type`` on ``infos``."""
    desc = make_descriptor(op_type, attributes or {}, opset=opset, num_outputs=1)
    return get_layer_kind(op_type).infer(desc, infos, [None] * len(infos))


@pytest.mark.parametrize("op_type", sorted(ACTIVATIONS))
@settings(max_examples=25, deadline=None)
@given(data=st.data(), shape=SHAPES, seed=SEEDS, dtype=st.sampled_from([np.float32, np.float64]))
def test_activation_matches_reference(op_type, data, shape, seed, dtype):
    attributes = data.draw(ACTIVATIONS[op_type])
    x = (np.random.default_rng(seed).standard_normal(shape) * 4).astype(dtype)
    (y,) = assert_matches_reference(op_type, [x], attributes, rtol=1e-5, atol=1e-6)
    assert y.dtype == dtype


@pytest.mark.parametrize("op_type", ["Relu", "Sigmoid", "Gelu", "HardSwish"])
def test_float16_activation_stays_float16(op_type):
    x = np.linspace(-6, 6, 30, dtype=np.float16).reshape(5, 6)
    (y,) = assert_matches_reference(op_type, [x], rtol=2e-3, atol=2e-3)
    assert y.dtype == np.float16


def test_sigmoid_and_softplus_do_not_overflow_on_large_inputs():
    x = np.array([-1000, -90, 0, 90, 1000], dtype=np.float32)
    (sig,) = assert_matches_reference("Sigmoid", [x])
    assert np.isfinite(sig).all() and sig[0] == 0 and sig[-1] == 1
    (soft,) = assert_matches_reference("Softplus", [x])
    assert soft[-1] == 1000


def test_relu_accepts_signed_integers_from_opset_14():
    x = np.array([[-3, 0, 5]], dtype=np.int64)
    (y,) = assert_matches_reference("Relu", [x])
    assert y.tolist() == [[0, 0, 5]]


def test_selu_defaults_follow_the_opset():
    opset1 = make_descriptor("Selu", {}, opset=1, num_outputs=1)
    latest = make_descriptor("Selu", {}, opset=21, num_outputs=1)
    assert (opset1.alpha, opset1.gamma) == (1.6732, 1.0507)
    assert latest.alpha == pytest.approx(1.6732632423543772) and latest.gamma == pytest.approx(
        1.0507009873554805
    )
    assert make_descriptor("Selu", {"alpha": 2.0}, opset=1, num_outputs=1).alpha == 2.0


@settings(max_examples=25, deadline=None)
@given(shape=array_shapes(min_dims=1, max_dims=4, min_side=1, max_side=4), seed=SEEDS, data=st.data())
def test_prelu_slope_broadcasts_like_reference(shape, seed, data):
    rank = data.draw(st.integers(0, len(shape)))
    slope_shape = tuple(data.draw(st.sampled_from([1, d])) for d in shape[len(shape) - rank :])
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(shape).astype(np.float32)
    slope = rng.uniform(0, 1, slope_shape).astype(np.float32)
    assert_matches_reference("PRelu", [x, slope])


def test_prelu_before_opset_7_applies_a_vector_slope_per_channel():
    x = -np.ones((2, 3, 4, 4), dtype=np.float32)
    slope = np.array([0.1, 0.2, 0.3], dtype=np.float32)
    (y,), (info,) = run_flowrt_node("PRelu", [x, slope], opset=6)
    np.testing.assert_allclose(y[1, :, 2, 3], -slope)
    assert info.shape == (2, 3, 4, 4)


def test_prelu_slope_that_does_not_broadcast_raises_shape_error():
    with pytest.raises(ShapeError, match="does not broadcast"):
        infer("PRelu", [TensorInfo((2, 3, 4)), TensorInfo((3,))])
    with pytest.raises(ShapeError, match="higher rank"):
        infer("PRelu", [TensorInfo((3,)), TensorInfo((1, 3))])


@pytest.mark.parametrize("dtype", [np.float32, np.int8, np.int64, np.uint8])
@pytest.mark.parametrize("bounds", [(2, 6), (None, 6), (2, None), (5, 3), (None, None)])
def test_clip_with_optional_bound_inputs_matches_reference(dtype, bounds):
    x = np.arange(-4, 12).astype(dtype).reshape(4, 4)  # wraps for uint8: values on both sides
    inputs = [x] + [None if b is None else np.array(b, dtype=dtype) for b in bounds]
    while inputs[-1] is None:
        inputs.pop()
    (y,) = assert_matches_reference("Clip", inputs, opset=13)
    assert y.dtype == dtype


@pytest.mark.parametrize("attributes", [{"min": -1.0, "max": 2.5}, {"max": 0.5}, {"min": 0.0}, {}])
def test_clip_before_opset_11_takes_attributes(attributes):
    x = np.linspace(-3, 3, 12, dtype=np.float32)
    assert_matches_reference("Clip", [x], attributes, opset=6)


def test_clip_bound_must_be_a_scalar():
    with pytest.raises(ShapeError, match="scalar"):
        infer("Clip", [TensorInfo((2, 3)), TensorInfo((2,))])
    with pytest.raises(DataTypeError, match="one data type"):
        infer("Clip", [TensorInfo((2, 3)), TensorInfo((), DataType.FLOAT64)])


def test_bad_attribute_values_fail_when_the_descriptor_is_made():
    with pytest.raises(ModelLoadError, match="approximate"):
        make_descriptor("Gelu", {"approximate": "fast"}, opset=20, num_outputs=1)
    with pytest.raises(ModelLoadError, match="nonzero"):
        make_descriptor("Celu", {"alpha": 0.0}, opset=12, num_outputs=1)


def test_activation_infer_copes_with_unknown_dims_and_refuses_integers():
    (y,) = infer("Sigmoid", [TensorInfo(("N", None, 3))])
    assert y.shape == ("N", None, 3)
    (y,) = infer("PRelu", [TensorInfo(None), TensorInfo((3,))])
    assert y.shape is None
    (y,) = infer("PRelu", [TensorInfo(("N", None, 4)), TensorInfo((None, 1))])
    assert y.shape == ("N", None, 4)
    with pytest.raises(DataTypeError, match="expects one of"):
        infer("Elu", [TensorInfo((2,), DataType.INT32)])
