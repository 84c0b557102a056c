"""GpuAcc Slice and Split against CpuRef."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import flowrt


@st.composite
def _slices(draw):
    """A shape, and per sliced axis a start, end and step that leave at least one element."""
    shape = draw(hnp.array_shapes(min_dims=1, max_dims=5, max_side=7))
    axes = draw(st.lists(st.integers(0, len(shape) - 1), min_size=1, max_size=len(shape), unique=True))
    starts, ends, steps = [], [], []
    for a in axes:
        n = shape[a]
        step = draw(st.sampled_from([1, 1, 2, 3, -1, -2]))
        start = draw(st.integers(-n - 2, n + 2))
        end = draw(st.integers(-n - 2, n + 2) | st.just(2**62 if step > 0 else -(2**62)))
        if not len(range(*slice(start, end, step).indices(n))):
            start, end = (0, n) if step > 0 else (n - 1, -n - 1)
        starts.append(start), ends.append(end), steps.append(step)
    negative = draw(st.booleans())  # axes counted from the end
    axes = [a - len(shape) if negative else a for a in axes]
    return shape, [np.array(v, np.int64) for v in (starts, ends, axes, steps)]


@settings(max_examples=25, deadline=None)
@given(case=_slices(), constant=st.booleans())
def test_slice_matches_cpuref(run_both, case, constant):
    shape, params = case
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    # constants are read at load; otherwise the bounds come at each run, read on the host
    (got,), (expected,) = run_both(
        "Slice", flowrt.descriptors.Slice(), [x, *params], constant=(1, 2, 3, 4) if constant else ()
    )
    np.testing.assert_array_equal(got, expected)


def test_slice_takes_its_bounds_as_attributes_before_opset_10(run_both):
    x = np.arange(60, dtype=np.float32).reshape(3, 4, 5)
    desc = flowrt.descriptors.Slice(starts=(1, -4), ends=(3, 100), axes=(0, 2))
    (got,), (expected,) = run_both("Slice", desc, [x])
    np.testing.assert_array_equal(got, x[1:3, :, 1:])
    np.testing.assert_array_equal(got, expected)


@settings(max_examples=20, deadline=None)
@given(shape=hnp.array_shapes(min_dims=1, max_dims=4, min_side=2, max_side=8), data=st.data())
def test_split_matches_cpuref(run_both, shape, data):
    axis = data.draw(st.integers(0, len(shape) - 1))
    n = shape[axis]
    cuts = sorted(data.draw(st.sets(st.integers(1, n - 1), min_size=1, max_size=min(3, n - 1))))
    lengths = np.diff([0, *cuts, n]).astype(np.int64)
    x = np.random.default_rng(1).standard_normal(shape).astype(np.float32)
    desc = flowrt.descriptors.Split(axis=axis, num_outputs=len(lengths))
    got, expected = run_both("Split", desc, [x, lengths], constant=(1,))
    assert len(got) == len(lengths)
    for g, e in zip(got, expected, strict=True):
        np.testing.assert_array_equal(g, e)


@pytest.mark.parametrize("num_outputs", [2, 3])
def test_split_into_equal_pieces_without_lengths(run_both, num_outputs):
    x = np.arange(2 * 9 * 2, dtype=np.float32).reshape(2, 9, 2)
    got, expected = run_both("Split", flowrt.descriptors.Split(axis=1, num_outputs=num_outputs), [x])
    assert [g.shape[1] for g in got] == [e.shape[1] for e in expected]
    for g, e in zip(got, expected, strict=True):
        np.testing.assert_array_equal(g, e)
