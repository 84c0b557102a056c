"""GpuAcc unary functions and Pow against CpuRef."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import flowrt
from flowrt.engine.graph.layer_kind import get_layer_kind
from flowrt.workers.gpu.kernels.unary import UNARY_CODES

# Kinds whose domain is the positive numbers.
POSITIVE = {"Log", "Sqrt", "Reciprocal"}
DESCRIPTORS = {
    "Elu": flowrt.descriptors.Elu(alpha=0.7),
    "HardSigmoid": flowrt.descriptors.HardSigmoid(alpha=0.3, beta=0.4),
}


def _descriptor(kind: str):
    return DESCRIPTORS.get(kind) or get_layer_kind(kind).descriptor()


@pytest.mark.parametrize("kind", sorted(UNARY_CODES))
@settings(max_examples=5, deadline=None)
@given(
    x=hnp.arrays(np.float32, hnp.array_shapes(max_dims=4, max_side=7), elements=st.floats(-4, 4, width=32)),
)
def test_unary_matches_cpuref(run_both, kind, x):
    if kind in POSITIVE:
        x = np.abs(x) + np.float32(0.25)
    if kind == "Round":
        x = x + np.float32(0.01)  # off the halves, where float32 noise decides the direction
    (got,), (expected,) = run_both(kind, _descriptor(kind), [x])
    np.testing.assert_allclose(got, expected, rtol=2e-5, atol=2e-6)


@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_gelu_both_forms_match_cpuref(run_both, approximate):
    x = np.linspace(-5, 5, 301, dtype=np.float32).reshape(7, 43)
    desc = flowrt.descriptors.Gelu(approximate=approximate)
    (got,), (expected,) = run_both("Gelu", desc, [x])
    np.testing.assert_allclose(got, expected, rtol=2e-5, atol=2e-6)


@settings(max_examples=15, deadline=None)
@given(
    shapes=hnp.mutually_broadcastable_shapes(num_shapes=2, max_dims=4, max_side=6),
    seed=st.integers(0, 2**31),
)
def test_pow_broadcasts_as_cpuref(run_both, shapes, seed):
    rng = np.random.default_rng(seed)
    base = (rng.random(shapes.input_shapes[0]) * 3 + 0.1).astype(np.float32)
    exponent = rng.choice([-1.5, 0.5, 2.0, 3.0], shapes.input_shapes[1]).astype(np.float32)
    (got,), (expected,) = run_both("Pow", flowrt.descriptors.Pow(), [base, exponent], constant=(1,))
    np.testing.assert_allclose(got, expected, rtol=2e-5, atol=1e-6)


@pytest.mark.parametrize(
    "bounds, descriptor",
    [
        ((-0.5, 0.5), flowrt.descriptors.Clip()),
        ((0.0,), flowrt.descriptors.Clip()),  # ReLU6-like without its top: max absent
        ((), flowrt.descriptors.Clip()),  # no bounds: the identity
        ((), flowrt.descriptors.Clip(min=0.0, max=6.0, opset=6)),  # bounds as attributes
    ],
)
def test_clip_matches_cpuref_with_bounds_as_inputs_or_attributes(run_both, bounds, descriptor):
    x = np.linspace(-8, 8, 2 * 3 * 5, dtype=np.float32).reshape(2, 3, 5)
    inputs = [x, *(np.float32(b) for b in bounds)]
    (got,), (expected,) = run_both("Clip", descriptor, inputs, constant=tuple(range(1, len(inputs))))
    np.testing.assert_array_equal(got, expected)
