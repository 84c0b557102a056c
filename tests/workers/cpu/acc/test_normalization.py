"""CpuAcc BatchNormalization, LRN and LayerNormalization against CpuRef."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import flowrt
from flowrt.registry import FusedActivation, WorkloadInfo
from flowrt.types import TensorInfo
from flowrt.workers.cpu.acc.kernels import load_all as acc_kernels
from flowrt.workers.cpu.ref.kernels import load_all as ref_kernels


def _run_both(kind, inputs, workers, constant=True, given_outputs=False, activation=None, **attributes):
    desc = getattr(flowrt.descriptors, kind)(**attributes)
    expected = ref_kernels()[kind](desc, *inputs)
    expected = [np.asarray(e) for e in (expected if isinstance(expected, tuple) else (expected,))]
    infos = tuple(None if i is None else TensorInfo.of(i) for i in inputs)
    constants = (None,) + tuple(i if constant else None for i in inputs[1:])
    info = WorkloadInfo(
        "layer", kind, desc, infos, tuple(TensorInfo.of(e) for e in expected), constants, activation
    )
    assert acc_kernels()[kind].supports(info).supported
    kernel = acc_kernels()[kind](info, workers)
    outputs = [np.full_like(e, np.nan) for e in expected] if given_outputs else None
    got = kernel.execute(list(inputs), outputs)
    if given_outputs:
        assert all(g is o for g, o in zip(got, outputs, strict=True))
    for g, e in zip(got, expected, strict=True):
        assert g.dtype == e.dtype and g.shape == e.shape
    return got, expected


def _data(seed, shape, low=-10, high=10):
    return np.random.default_rng(seed).uniform(low, high, shape).astype(np.float32)


@settings(max_examples=25, deadline=None)
@given(
    shape=st.lists(st.integers(1, 9), min_size=2, max_size=5),
    workers=st.integers(1, 3),
    constant=st.booleans(),
    given_outputs=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_batch_normalization_matches_cpuref(shape, workers, constant, given_outputs, seed):
    c = shape[1]
    params = [_data(seed + 1, c), _data(seed + 2, c), _data(seed + 3, c), _data(seed + 4, c, 0.1, 4)]
    (got,), (expected,) = _run_both(
        "BatchNormalization", [_data(seed, shape), *params], workers, constant, given_outputs, epsilon=1e-3
    )
    np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-5)


@pytest.mark.parametrize(
    "activation, apply",
    [
        (FusedActivation("Relu"), lambda y: np.maximum(y, 0)),
        (FusedActivation("LeakyRelu", 0.1), lambda y: np.where(y >= 0, y, y * np.float32(0.1))),
        (FusedActivation("Clip", 0.0, 6.0), lambda y: np.clip(y, 0, 6)),
    ],
)
def test_batch_normalization_applies_its_fused_activation(activation, apply):
    x, c = _data(0, (2, 5, 17, 19)), 5
    params = [_data(1, c), _data(2, c), _data(3, c), _data(4, c, 0.1, 4)]
    (got,), (expected,) = _run_both("BatchNormalization", [x, *params], 2, activation=activation, opset=9)
    np.testing.assert_allclose(got, apply(expected), rtol=1e-6, atol=1e-5)


def test_batch_normalization_training_and_per_activation_forms_are_declined():
    support = flowrt.backend_registry().get("CpuAcc").layer_support()
    x, p = TensorInfo((1, 3, 4, 4)), TensorInfo((3,))
    for desc, reason in [
        (flowrt.descriptors.BatchNormalization(training_mode=1), "training"),
        (flowrt.descriptors.BatchNormalization(spatial=0, opset=7), "spatial=1"),
        (flowrt.descriptors.BatchNormalization(num_outputs=3, is_test=1, opset=6), "running statistics"),
    ]:
        answer = support.is_layer_supported("BatchNormalization", desc, [x, p, p, p, p], [x])
        assert not answer.supported and reason in answer.reason


@settings(max_examples=25, deadline=None)
@given(
    n=st.integers(1, 3),
    c=st.integers(1, 12),
    spatial=st.lists(st.integers(1, 40), min_size=0, max_size=2),
    size=st.integers(1, 7),
    alpha=st.floats(1e-5, 1e-1),
    beta=st.floats(0.25, 1.0),
    bias=st.floats(0.5, 2.0),
    workers=st.integers(1, 3),
    given_outputs=st.booleans(),
)
def test_lrn_matches_cpuref(n, c, spatial, size, alpha, beta, bias, workers, given_outputs):
    x = _data(n * c + size, (n, c, *spatial))
    (got,), (expected,) = _run_both(
        "LRN", [x], workers, given_outputs=given_outputs, size=size, alpha=alpha, beta=beta, bias=bias
    )
    np.testing.assert_allclose(got, expected, rtol=2e-6, atol=1e-6)


@pytest.mark.parametrize("beta", [0.75, 0.6])
def test_lrn_three_quarter_power_by_square_roots_stays_within_float32_rounding(beta):
    # beta 0.75 (AlexNet, GoogLeNet) takes the square-root path, any other beta takes pow.
    x = np.maximum(_data(11, (1, 64, 20, 20)), 0) * 50
    (got,), (expected,) = _run_both("LRN", [x], 2, size=5, alpha=1e-2, beta=beta, bias=1.0)
    ulps = np.abs(got.view(np.int32).astype(np.int64) - expected.view(np.int32))
    assert ulps.max() <= 4


def test_lrn_on_alexnets_first_block_spans_several_position_blocks():
    x = np.maximum(_data(7, (2, 96, 27, 27)), 0) * 20
    (got,), (expected,) = _run_both("LRN", [x], 3, size=5, alpha=1e-4, beta=0.75, bias=1.0)
    np.testing.assert_allclose(got, expected, rtol=2e-6)


@settings(max_examples=25, deadline=None)
@given(
    shape=st.lists(st.integers(1, 12), min_size=1, max_size=4),
    data=st.data(),
    with_bias=st.booleans(),
    constant=st.booleans(),
    num_outputs=st.integers(1, 3),
    workers=st.integers(1, 3),
    given_outputs=st.booleans(),
)
def test_layer_normalization_matches_cpuref(
    shape, data, with_bias, constant, num_outputs, workers, given_outputs
):
    axis = data.draw(st.integers(-len(shape), len(shape) - 1))
    normalized = tuple(shape[axis:])
    # Scale and bias may broadcast over the leading normalized dims.
    param_shape = normalized[data.draw(st.integers(0, len(normalized) - 1)) :]
    inputs = [_data(len(shape), shape), _data(1, param_shape), _data(2, param_shape) if with_bias else None]
    got, expected = _run_both(
        "LayerNormalization", inputs, workers, constant, given_outputs, axis=axis, num_outputs=num_outputs
    )
    for g, e in zip(got, expected, strict=True):
        np.testing.assert_allclose(g, e, rtol=1e-5, atol=1e-5)
