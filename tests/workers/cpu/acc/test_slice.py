"""CpuAcc Slice against CpuRef: any axes, negative steps, clamping, constant or computed
starts/ends, planned outputs; and in a network, next to a layer CpuAcc runs."""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import flowrt
from flowrt.registry import WorkloadInfo
from flowrt.types import TensorInfo
from flowrt.workers.cpu.acc.kernels import load_all as acc_kernels
from flowrt.workers.cpu.ref.kernels import load_all as ref_kernels


def _run_both(x, params, workers=2, constant=True, given_outputs=False, desc=None):
    desc = desc or flowrt.descriptors.Slice()
    extra = [None if p is None else np.array(p, np.int64) for p in params]
    inputs = [x, *extra]
    expected = ref_kernels()["Slice"](desc, *inputs)
    infos = tuple(None if a is None else TensorInfo.of(a) for a in inputs)
    constants = (None, *extra) if constant else (None,) * len(inputs)
    info = WorkloadInfo("layer", "Slice", desc, infos, (TensorInfo.of(expected),), constants)
    outputs = [np.empty(expected.shape, expected.dtype)] if given_outputs else None
    (got,) = acc_kernels()["Slice"](info, workers).execute(inputs, outputs)
    if given_outputs:
        assert got is outputs[0]
    return got, expected


# Bounds well past the ends, as exports write them (INT64_MAX for "to the end").
_BOUND = st.sampled_from([-(2**63), -(2**31), 2**31 - 1, 2**63 - 1]) | st.integers(-9, 9)


@st.composite
def slice_case(draw):
    dtype = draw(st.sampled_from([np.float32, np.float32, np.int64, np.bool_]))
    x = draw(hnp.arrays(dtype, hnp.array_shapes(min_dims=1, max_dims=4, min_side=0, max_side=7)))
    axes = draw(st.lists(st.integers(0, x.ndim - 1), min_size=1, max_size=x.ndim, unique=True))
    axes = [a - x.ndim if draw(st.booleans()) else a for a in axes]  # negative axes too
    starts = draw(st.lists(_BOUND, min_size=len(axes), max_size=len(axes)))
    ends = draw(st.lists(_BOUND, min_size=len(axes), max_size=len(axes)))
    steps = draw(st.lists(st.sampled_from([-3, -2, -1, 1, 2, 3]), min_size=len(axes), max_size=len(axes)))
    return x, [starts, ends, axes, steps]


@settings(max_examples=25, deadline=None)
@given(case=slice_case(), workers=st.integers(1, 3), constant=st.booleans(), given_outputs=st.booleans())
def test_slice_matches_cpuref(case, workers, constant, given_outputs):
    x, params = case
    got, expected = _run_both(x, params, workers, constant, given_outputs)
    assert got.dtype == expected.dtype and got.shape == expected.shape
    np.testing.assert_array_equal(got, expected)


def test_large_slices_split_across_workers_forwards_and_backwards():
    x = np.random.default_rng(0).standard_normal((8, 96, 160), dtype=np.float32)
    for params in ([[0], [64], [1], [1]], [[-1, 150], [0, 3], [1, 2], [-1, -1]], [[2], [8], [0], [1]]):
        got, expected = _run_both(x, params, workers=3, given_outputs=True)
        np.testing.assert_array_equal(got, expected)


def test_opset_1_attributes_and_absent_axes_and_steps():
    x = np.arange(60, dtype=np.float32).reshape(3, 4, 5)
    desc = flowrt.descriptors.Slice(starts=(1, -3), ends=(3, 100), axes=(0, 2))
    got, expected = _run_both(x, [], desc=desc)
    np.testing.assert_array_equal(got, expected)
    got, expected = _run_both(x, [[1, 0], [3, 2], None, None])
    np.testing.assert_array_equal(got, x[1:3, 0:2])


def test_chained_slices_run_on_cpuacc():
    net = flowrt.Network()
    x = net.add_input("x", TensorInfo((2, 6, 8)))
    bounds = [np.array(v, np.int64) for v in ([5, 1], [0, 2**63 - 1], [1, 2], [-2, 3])]
    first = net.add_layer("Slice", inputs=[x, *bounds], name="first")
    second = net.add_layer("Slice", inputs=[first, *bounds[:3]], name="second")
    net.add_output("y", second)
    opt = flowrt.optimize(net, backends=["CpuAcc", "CpuRef"])
    assert opt.assignments() == {"first": "CpuAcc", "second": "CpuAcc"}
    data = np.random.default_rng(1).standard_normal((2, 6, 8), dtype=np.float32)
    (y,) = flowrt.InferenceSession(opt).run(None, {"x": data})
    np.testing.assert_array_equal(y, data[:, 5:0:-2, 1::3][:, 5:, 1:])
