"""CpuAcc Add, Sub, Mul, Div, Pow, Sum, Max and Min against CpuRef: broadcasting, fused activations,
planned outputs, NaN and the signed zeros."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import flowrt
from flowrt.registry import FusedActivation, WorkloadInfo
from flowrt.types import TensorInfo
from flowrt.workers.cpu.acc.kernels import load_all as acc_kernels
from flowrt.workers.cpu.ref.kernels import load_all as ref_kernels

ACTIVATIONS = [None, FusedActivation("Relu"), FusedActivation("Clip", -0.5, 0.5), FusedActivation("Sigmoid")]


def _run_both(kind, inputs, workers, activation=None, given_outputs=False, constants=None, **attributes):
    desc = getattr(flowrt.descriptors, kind)(**attributes)
    with np.errstate(all="ignore"):
        expected = np.asarray(ref_kernels()[kind](desc, *inputs))
    if activation is not None:
        act = activation.kind
        act_desc = getattr(flowrt.descriptors, act)()
        extra = [np.float32(activation.alpha), np.float32(activation.beta)] if act == "Clip" else []
        expected = np.asarray(ref_kernels()[act](act_desc, expected, *extra))
    infos = tuple(TensorInfo.of(x) for x in inputs)
    info = WorkloadInfo(
        "layer", kind, desc, infos, (TensorInfo.of(expected),), constants or (None,) * len(inputs), activation
    )
    kernel = acc_kernels()[kind](info, workers)
    outputs = [np.full(expected.shape, np.nan, np.float32)] if given_outputs else None
    (got,) = kernel.execute(list(inputs), outputs)
    if given_outputs:
        assert got is outputs[0]
    return got, expected


@st.composite
def broadcastable(draw, count):
    shapes = draw(hnp.mutually_broadcastable_shapes(num_shapes=count, max_dims=5, max_side=9))
    elements = st.floats(-10, 10, width=32)
    return [draw(hnp.arrays(np.float32, s, elements=elements)) for s in shapes.input_shapes]


@settings(max_examples=30, deadline=None)
@given(
    kind=st.sampled_from(["Add", "Sub", "Mul", "Div"]),
    inputs=broadcastable(2),
    activation=st.sampled_from(ACTIVATIONS),
    workers=st.integers(1, 3),
    given_outputs=st.booleans(),
)
def test_binary_ops_broadcast_as_cpuref(kind, inputs, activation, workers, given_outputs):
    with np.errstate(all="ignore"):
        got, expected = _run_both(kind, inputs, workers, activation, given_outputs)
    assert got.dtype == np.float32 and got.shape == expected.shape
    np.testing.assert_allclose(got, expected, rtol=2e-6, atol=1e-7)


@settings(max_examples=15, deadline=None)
@given(
    inputs=st.integers(1, 4).flatmap(broadcastable), workers=st.integers(1, 3), given_outputs=st.booleans()
)
def test_sum_of_any_number_of_inputs_matches_cpuref(inputs, workers, given_outputs):
    got, expected = _run_both("Sum", inputs, workers, FusedActivation("Relu"), given_outputs)
    np.testing.assert_allclose(got, expected, rtol=2e-6, atol=1e-6)


@pytest.mark.parametrize(
    ("a_shape", "b_shape"),
    [((1, 64, 56, 56), (64, 1, 1)), ((2, 64, 7, 9), (1, 64, 1, 1)), ((3, 40000), (3, 40000)), ((5, 3), ())],
)
@pytest.mark.parametrize("kind", ["Mul", "Add"])
def test_per_channel_constants_and_large_same_shape_inputs(kind, a_shape, b_shape):
    rng = np.random.default_rng(0)
    a = rng.standard_normal(a_shape, dtype=np.float32)
    b = np.asarray(rng.standard_normal(b_shape, dtype=np.float32))
    for inputs in ([a, b], [b, a]):
        got, expected = _run_both(kind, inputs, 3, FusedActivation("Relu"), given_outputs=True)
        np.testing.assert_array_equal(got, expected)


def test_non_contiguous_inputs_and_division_by_zero():
    a = np.arange(24, dtype=np.float32).reshape(4, 6).T
    b = np.zeros((4,), np.float32)
    with np.errstate(all="ignore"):
        got, expected = _run_both("Div", [a, b], 2)
    np.testing.assert_array_equal(got, expected)


def test_legacy_broadcast_lines_b_up_from_axis():
    a = np.ones((2, 3, 4), np.float32)
    b = np.arange(3, dtype=np.float32)
    got, expected = _run_both("Add", [a, b], 2, broadcast=1, axis=1, opset=6)
    np.testing.assert_array_equal(got, expected)


def test_non_float32_is_declined_with_a_reason():
    support = flowrt.backend_registry().get("CpuAcc").layer_support()
    answer = support.is_layer_supported(
        "Add", None, [TensorInfo((3,), "int64"), TensorInfo((3,), "int64")], [TensorInfo((3,), "int64")]
    )
    assert not answer.supported and answer.reason == "CpuAcc Add takes float32 only"


def test_sum_whose_first_two_inputs_both_repeat_along_the_output_rows():
    # x0 + x1 is written over the whole output, where neither operand varies along a row
    rng = np.random.default_rng(3)
    inputs = [np.asarray(rng.standard_normal(s), np.float32) for s in [(), (9, 1), (1, 1, 1, 1, 9)]]
    got, expected = _run_both("Sum", inputs, 2, FusedActivation("Relu"), False)
    np.testing.assert_allclose(got, expected, rtol=2e-6, atol=1e-6)


@settings(max_examples=25, deadline=None)
@given(
    kind=st.sampled_from(["Pow", "Max", "Min"]),
    inputs=broadcastable(2),
    workers=st.integers(1, 3),
    given_outputs=st.booleans(),
)
def test_pow_max_min_broadcast_as_cpuref(kind, inputs, workers, given_outputs):
    # a negative base to a fractional power is NaN on both sides
    got, expected = _run_both(kind, inputs, workers, given_outputs=given_outputs)
    assert got.dtype == np.float32 and got.shape == expected.shape
    np.testing.assert_allclose(got, expected, rtol=2e-6, atol=1e-30, equal_nan=True)


@settings(max_examples=15, deadline=None)
@given(
    inputs=st.integers(1, 4).flatmap(broadcastable),
    kind=st.sampled_from(["Max", "Min"]),
    workers=st.integers(1, 3),
)
def test_max_and_min_of_any_number_of_inputs_match_cpuref(inputs, kind, workers):
    got, expected = _run_both(kind, inputs, workers, FusedActivation("Relu"))
    np.testing.assert_array_equal(got, expected)


EDGES = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1e-45, -2.0, -0.5, 0.5, 2.0, 3e19, -3e19], np.float32)


@pytest.mark.parametrize("exponent", [2.0, 0.5, 1.0, 3.0, 0.0, -1.0, 1.7, np.nan, np.inf])
@pytest.mark.parametrize("constant", [True, False])
def test_pow_with_a_scalar_exponent_gives_what_cpuref_gives(exponent, constant):
    # 2, 0.5, 1 and 3 take loops of their own; 0.5 is sqrt as in numpy: -0.0 for -0.0, NaN
    # for -inf. A constant exponent arrives read-only.
    e = np.array(exponent, np.float32)
    e.flags.writeable = not constant
    x = np.tile(EDGES, 3)
    got, expected = _run_both("Pow", [x, e], 2, constants=(None, e) if constant else None)
    np.testing.assert_allclose(got, expected, rtol=2e-6, atol=0, equal_nan=True)
    assert (np.signbit(got) == np.signbit(expected))[~np.isnan(expected)].all()


@pytest.mark.parametrize("kind", ["Max", "Min"])
def test_max_and_min_propagate_nan_from_either_side_and_order_signed_zeros_as_numpy(kind):
    a = np.repeat(EDGES, EDGES.size)
    b = np.tile(EDGES, EDGES.size)
    for inputs in ([a, b], [b, a], [a.reshape(-1, EDGES.size), EDGES], [np.float32(np.nan).reshape(()), a]):
        got, expected = _run_both(kind, inputs, 2)
        np.testing.assert_array_equal(got, expected)
        assert (np.signbit(got) == np.signbit(expected)).all()


def test_pow_with_a_non_float32_exponent_is_declined_with_a_reason():
    support = flowrt.backend_registry().get("CpuAcc").layer_support()
    answer = support.is_layer_supported(
        "Pow", None, [TensorInfo((3,)), TensorInfo((), "int64")], [TensorInfo((3,))]
    )
    assert not answer.supported and answer.reason == "CpuAcc Pow takes float32 only"
