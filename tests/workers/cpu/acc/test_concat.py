"""CpuAcc Concat against CpuRef: any axis, any number of inputs, data types, planned outputs."""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import flowrt
from flowrt.registry import WorkloadInfo
from flowrt.types import TensorInfo
from flowrt.workers.cpu.acc.kernels import load_all as acc_kernels
from flowrt.workers.cpu.ref.kernels import load_all as ref_kernels


def _run_both(inputs, axis, workers, given_outputs):
    desc = flowrt.descriptors.Concat(axis=axis)
    expected = ref_kernels()["Concat"](desc, *inputs)
    infos = tuple(TensorInfo.of(x) for x in inputs)
    kernel = acc_kernels()["Concat"](
        WorkloadInfo("layer", "Concat", desc, infos, (TensorInfo.of(expected),)), workers
    )
    outputs = [np.empty_like(expected)] if given_outputs else None
    (got,) = kernel.execute(inputs, outputs)
    if given_outputs:
        assert got is outputs[0]
    return got, expected


@st.composite
def concat_case(draw):
    shape = draw(hnp.array_shapes(min_dims=1, max_dims=4, min_side=0, max_side=7))
    axis = draw(st.integers(-len(shape), len(shape) - 1))
    dtype = draw(st.sampled_from([np.float32, np.int64, np.uint8, np.float16]))
    inputs = []
    for _ in range(draw(st.integers(1, 4))):
        part = list(shape)
        part[axis] = draw(st.integers(0, 6))
        inputs.append(draw(hnp.arrays(dtype, tuple(part))))
    return inputs, axis


@settings(max_examples=30, deadline=None)
@given(case=concat_case(), workers=st.integers(1, 3), given_outputs=st.booleans())
def test_concat_matches_cpuref(case, workers, given_outputs):
    inputs, axis = case
    got, expected = _run_both(inputs, axis, workers, given_outputs)
    assert got.dtype == expected.dtype
    np.testing.assert_array_equal(got, expected)


def test_channel_concat_of_one_image_spreads_over_workers():
    rng = np.random.default_rng(0)
    inputs = [rng.standard_normal((1, c, 28, 28), dtype=np.float32) for c in (64, 32, 64, 96)]
    inputs[1] = inputs[1][:, :, ::-1]  # a non-contiguous view is read too
    got, expected = _run_both(inputs, 1, 3, given_outputs=True)
    np.testing.assert_array_equal(got, expected)
