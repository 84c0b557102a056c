"""CpuAcc Pad against CpuRef: every mode, negative pads, pads as attribute or input."""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import flowrt
from flowrt.registry import WorkloadInfo
from flowrt.types import TensorInfo
from flowrt.workers.cpu.acc.kernels import load_all as acc_kernels
from flowrt.workers.cpu.ref.kernels import load_all as ref_kernels


def _run_both(desc, inputs, workers, given_outputs=False):
    expected = ref_kernels()["Pad"](desc, *inputs)
    infos = tuple(None if x is None else TensorInfo.of(x) for x in inputs)
    info = WorkloadInfo("layer", "Pad", desc, infos, (TensorInfo.of(expected),))
    outputs = [np.empty_like(expected)] if given_outputs else None
    (got,) = acc_kernels()["Pad"](info, workers).execute(list(inputs), outputs)
    return got, expected


@st.composite
def pad_case(draw):
    dtype = draw(st.sampled_from([np.float32, np.int32, np.float64]))
    x = draw(hnp.arrays(dtype, hnp.array_shapes(min_dims=1, max_dims=4, min_side=2, max_side=6)))
    mode = draw(st.sampled_from(["constant", "reflect", "edge", "wrap"]))
    low = 0 if mode != "constant" else -1  # numpy cannot reflect what a crop emptied
    counts = draw(st.lists(st.integers(low, 4), min_size=2 * x.ndim, max_size=2 * x.ndim))
    if mode == "reflect":
        counts = [min(c, n - 1) for c, n in zip(counts, x.shape * 2)]
    return x, mode, counts


@settings(max_examples=30, deadline=None)
@given(case=pad_case(), as_input=st.booleans(), workers=st.integers(1, 3), given_outputs=st.booleans())
def test_pad_matches_cpuref(case, as_input, workers, given_outputs):
    x, mode, counts = case
    if as_input:
        desc = flowrt.descriptors.Pad(mode=mode)
        inputs = [x, np.array(counts, np.int64), np.array(2.5, x.dtype)]
    else:
        desc = flowrt.descriptors.Pad(mode=mode, pads=tuple(counts), value=-1.5)
        inputs = [x]
    got, expected = _run_both(desc, inputs, workers, given_outputs)
    assert got.dtype == expected.dtype
    np.testing.assert_array_equal(got, expected)


def test_pad_over_chosen_axes_only():
    x = np.arange(2 * 3 * 4, dtype=np.float32).reshape(2, 3, 4)
    desc = flowrt.descriptors.Pad()
    got, expected = _run_both(desc, [x, np.array([1, 2, 3, 0]), None, np.array([-1, 1])], 2)
    assert got.shape == (2, 5, 8)
    np.testing.assert_array_equal(got, expected)
