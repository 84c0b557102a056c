"""GpuAcc activations and broadcasting binary ops against CpuRef."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import flowrt
from flowrt.registry import FusedActivation
from flowrt.workers.cpu.ref.kernels import load_all as ref_kernels

FLOATS = st.floats(-50, 50, width=32)


@settings(max_examples=15, deadline=None)
@given(
    kind=st.sampled_from(["Relu", "LeakyRelu", "Sigmoid", "Tanh"]),
    x=hnp.arrays(np.float32, hnp.array_shapes(min_dims=1, max_dims=4, max_side=20), elements=FLOATS),
)
def test_activations_match_cpuref(run_both, kind, x):
    desc = getattr(flowrt.descriptors, kind)()
    (got,), (expected,) = run_both(kind, desc, [x])
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)


@settings(max_examples=15, deadline=None)
@given(
    kind=st.sampled_from(["Add", "Sub", "Mul", "Div"]),
    shapes=hnp.mutually_broadcastable_shapes(num_shapes=2, max_dims=5, max_side=8),
    data=st.data(),
)
def test_binary_ops_broadcast_like_cpuref(run_both, kind, shapes, data):
    a, b = (
        data.draw(hnp.arrays(np.float32, shape, elements=st.floats(0.5, 50, width=32)))
        for shape in shapes.input_shapes
    )
    if a.size == 0 or b.size == 0:
        return
    (got,), (expected,) = run_both(kind, getattr(flowrt.descriptors, kind)(), [a, b])
    np.testing.assert_allclose(got, expected, rtol=1e-6)


def test_sum_folds_three_broadcasting_inputs(run_both):
    rng = np.random.default_rng(1)
    inputs = [rng.standard_normal(s).astype(np.float32) for s in [(2, 3, 4), (3, 1), (4,)]]
    (got,), (expected,) = run_both("Sum", flowrt.descriptors.Sum(), inputs)
    np.testing.assert_allclose(got, expected, rtol=1e-6)


@pytest.mark.parametrize(
    "activation",
    [
        FusedActivation("Relu"),
        FusedActivation("LeakyRelu", alpha=0.1),
        FusedActivation("Clip", alpha=-0.5, beta=0.25),
        FusedActivation("Sigmoid"),
        FusedActivation("Tanh"),
    ],
)
def test_fused_activation_applies_to_the_output(run_both, activation):
    rng = np.random.default_rng(2)
    a, b = rng.standard_normal((3, 5)).astype(np.float32), rng.standard_normal(5).astype(np.float32)
    (got,), (added,) = run_both("Add", flowrt.descriptors.Add(), [a, b], activation=activation)
    kind = activation.kind
    if kind == "Clip":
        expected = np.clip(added, activation.alpha, activation.beta)
    else:
        desc = getattr(flowrt.descriptors, kind)(
            **({"alpha": activation.alpha} if kind == "LeakyRelu" else {})
        )
        expected = ref_kernels()[kind](desc, added)
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-7)


def test_sigmoid_saturates_without_overflow(run_both):
    x = np.array([-1e4, -100, 0, 100, 1e4], np.float32)
    (got,), _ = run_both("Sigmoid", flowrt.descriptors.Sigmoid(), [x])
    np.testing.assert_allclose(got, [0, 0, 0.5, 1, 1], atol=1e-30)
