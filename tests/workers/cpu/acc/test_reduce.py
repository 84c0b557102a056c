"""CpuAcc ReduceSum, ReduceMean and ReduceMax against CpuRef: any axes, keepdims, axes as input."""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import flowrt
from flowrt.registry import WorkloadInfo
from flowrt.types import TensorInfo
from flowrt.workers.cpu.acc.kernels import load_all as acc_kernels
from flowrt.workers.cpu.ref.kernels import load_all as ref_kernels

KINDS = ["ReduceSum", "ReduceMean", "ReduceMax"]


def _run_both(kind, inputs, workers, given_outputs=False, **attributes):
    desc = getattr(flowrt.descriptors, kind)(**attributes)
    with np.errstate(all="ignore"):
        expected = ref_kernels()[kind](desc, *inputs)
    infos = tuple(TensorInfo.of(x) for x in inputs)
    info = WorkloadInfo("layer", kind, desc, infos, (TensorInfo.of(expected),))
    outputs = [np.empty_like(expected)] if given_outputs else None
    (got,) = acc_kernels()[kind](info, workers).execute(inputs, outputs)
    return got, expected


@st.composite
def reduce_case(draw):
    x = draw(
        hnp.arrays(
            np.float32,
            hnp.array_shapes(min_dims=1, max_dims=5, min_side=0, max_side=7),
            elements=st.floats(-100, 100, width=32),
        )
    )
    axes = draw(st.lists(st.integers(-x.ndim, x.ndim - 1), unique_by=lambda a: a % x.ndim, max_size=x.ndim))
    return x, axes


@settings(max_examples=30, deadline=None)
@given(
    kind=st.sampled_from(KINDS),
    case=reduce_case(),
    keepdims=st.integers(0, 1),
    axes_as_input=st.booleans(),
    workers=st.integers(1, 3),
    given_outputs=st.booleans(),
)
def test_reductions_match_cpuref(kind, case, keepdims, axes_as_input, workers, given_outputs):
    x, axes = case
    if axes_as_input:
        got, expected = _run_both(
            kind, [x, np.array(axes, np.int64)], workers, given_outputs, keepdims=keepdims
        )
    else:
        got, expected = _run_both(kind, [x], workers, given_outputs, axes=axes or None, keepdims=keepdims)
    assert got.shape == expected.shape and got.dtype == np.float32
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-4)


def test_global_mean_and_channel_max_of_a_feature_map():
    x = np.random.default_rng(0).standard_normal((2, 256, 14, 14), dtype=np.float32)
    got, expected = _run_both("ReduceMean", [x], 3, axes=(2, 3))
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)
    got, expected = _run_both("ReduceMax", [x], 3, True, axes=(1,), keepdims=0)
    np.testing.assert_array_equal(got, expected)


def test_empty_axes_with_noop_flag_is_the_identity():
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    got, expected = _run_both("ReduceSum", [x, np.array([], np.int64)], 2, noop_with_empty_axes=1)
    np.testing.assert_array_equal(got, expected)


def test_a_global_pooling_reduces_each_contiguous_run_nan_included():
    x = np.random.default_rng(0).standard_normal((2, 96, 14, 14), dtype=np.float32)
    x[1, 5, 3, 7] = np.nan
    for kind in KINDS:
        got, expected = _run_both(kind, [x], 2, axes=[2, 3], keepdims=1)
        assert got.shape == (2, 96, 1, 1)
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)
        assert np.isnan(got[1, 5, 0, 0]) and np.isfinite(np.delete(got.ravel(), 96 + 5)).all()
