"""CpuAcc Transpose against CpuRef: any permutation and data type, shufflenet's channel shuffle."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import flowrt
from flowrt.registry import WorkloadInfo
from flowrt.types import TensorInfo
from flowrt.workers.cpu.acc.kernels import load_all as acc_kernels
from flowrt.workers.cpu.ref.kernels import load_all as ref_kernels


def _run_both(x, perm, workers, given_outputs=False):
    desc = flowrt.descriptors.Transpose(perm=perm)
    expected = ref_kernels()["Transpose"](desc, x)
    info = WorkloadInfo("layer", "Transpose", desc, (TensorInfo.of(x),), (TensorInfo.of(expected),))
    outputs = [np.empty_like(expected)] if given_outputs else None
    (got,) = acc_kernels()["Transpose"](info, workers).execute([x], outputs)
    return got, expected


@st.composite
def transpose_case(draw):
    dtype = draw(st.sampled_from([np.float32, np.int64, np.int8, np.float16, np.bool_]))
    x = draw(hnp.arrays(dtype, hnp.array_shapes(min_dims=0, max_dims=6, min_side=0, max_side=6)))
    perm = draw(st.none() | st.permutations(range(x.ndim)).map(tuple))
    return x, perm


@settings(max_examples=30, deadline=None)
@given(case=transpose_case(), workers=st.integers(1, 3), given_outputs=st.booleans())
def test_transpose_matches_cpuref(case, workers, given_outputs):
    x, perm = case
    got, expected = _run_both(x, perm, workers, given_outputs)
    assert got.dtype == expected.dtype and got.flags.c_contiguous
    np.testing.assert_array_equal(got, expected)


def test_channel_shuffle_and_a_strided_input():
    x = np.random.default_rng(0).standard_normal((1, 4, 60, 28, 28), dtype=np.float32)
    got, expected = _run_both(x, (0, 2, 1, 3, 4), 3, given_outputs=True)
    np.testing.assert_array_equal(got, expected)
    got, expected = _run_both(x[:, :, ::2], (0, 3, 4, 2, 1), 2)
    np.testing.assert_array_equal(got, expected)


@pytest.mark.parametrize("workers", [1, 3])
@pytest.mark.parametrize("dtype", [np.float32, np.int8, np.int64])
@pytest.mark.parametrize(
    "shape, perm",
    [
        ((1, 6, 197, 64), (0, 1, 3, 2)),  # attention's K transposed
        ((1, 197, 6, 64), (0, 2, 3, 1)),
        ((3, 45, 37), (0, 2, 1)),  # runs of 45 rows: blocks of BLOCK and a short one
        ((2, 19, 3, 40), (0, 3, 2, 1)),
    ],
)
def test_a_2d_transpose_inside_the_permutation_runs_in_blocks(shape, perm, dtype, workers):
    # neighbouring output rows start at neighbouring input elements: up to BLOCK of them are
    # gathered together, a run of the input per column; slices may cut a run anywhere
    x = np.arange(np.prod(shape)).reshape(shape).astype(dtype)
    got, expected = _run_both(x, perm, workers)
    np.testing.assert_array_equal(got, expected)
