"""CpuAcc Split against CpuRef: any axis, lengths from the attribute, a constant or computed
input, or equal pieces; planned outputs; and in a network with several outputs."""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import flowrt
from flowrt.registry import WorkloadInfo
from flowrt.types import TensorInfo
from flowrt.workers.cpu.acc.kernels import load_all as acc_kernels
from flowrt.workers.cpu.ref.kernels import load_all as ref_kernels


def _run_both(x, desc, lengths=None, workers=2, constant=True, given_outputs=False):
    inputs = [x] if lengths is None else [x, np.array(lengths, np.int64)]
    expected = ref_kernels()["Split"](desc, *inputs)
    constants = tuple(inputs[1:2]) if constant else (None,)
    info = WorkloadInfo(
        "layer", "Split", desc, tuple(TensorInfo.of(a) for a in inputs),
        tuple(TensorInfo.of(e) for e in expected), (None, *constants),
    )  # fmt: skip
    outputs = [np.empty(e.shape, e.dtype) for e in expected] if given_outputs else None
    got = acc_kernels()["Split"](info, workers).execute(inputs, outputs)
    if given_outputs:
        assert all(g is o for g, o in zip(got, outputs, strict=True))
    return got, expected


@st.composite
def split_case(draw):
    dtype = draw(st.sampled_from([np.float32, np.float32, np.int64]))
    x = draw(hnp.arrays(dtype, hnp.array_shapes(min_dims=1, max_dims=4, min_side=0, max_side=8)))
    axis = draw(st.integers(-x.ndim, x.ndim - 1))
    dim = x.shape[axis]
    count = draw(st.integers(1, 4))
    equal_fits = -(-dim // count) * (count - 1) <= dim  # ceil(dim / count) each but the last
    if draw(st.booleans()) or not equal_fits:  # explicit lengths (zeros allowed)
        cuts = sorted(draw(st.lists(st.integers(0, dim), min_size=count - 1, max_size=count - 1)))
        lengths = np.diff([0, *cuts, dim]).tolist()
    else:
        lengths = None  # as equal as can be
    how = draw(st.sampled_from(["input", "attribute"])) if lengths else "none"
    desc = flowrt.descriptors.Split(
        axis=axis, num_outputs=count, split=tuple(lengths) if how == "attribute" else None
    )
    return x, desc, lengths if how == "input" else None


@settings(max_examples=25, deadline=None)
@given(case=split_case(), workers=st.integers(1, 3), constant=st.booleans(), given_outputs=st.booleans())
def test_split_matches_cpuref(case, workers, constant, given_outputs):
    x, desc, lengths = case
    got, expected = _run_both(x, desc, lengths, workers, constant, given_outputs)
    assert len(got) == len(expected)
    for g, e in zip(got, expected, strict=True):
        assert g.dtype == e.dtype and g.shape == e.shape and g.flags.c_contiguous
        np.testing.assert_array_equal(g, e)


def test_fused_qkv_split_spreads_over_workers():
    qkv = np.random.default_rng(0).standard_normal((2, 128, 3 * 192), dtype=np.float32)
    got, expected = _run_both(
        qkv, flowrt.descriptors.Split(axis=-1, num_outputs=3), workers=3, given_outputs=True
    )
    for g, e in zip(got, expected, strict=True):
        np.testing.assert_array_equal(g, e)


def test_split_runs_on_cpuacc_with_several_outputs():
    net = flowrt.Network()
    x = net.add_input("x", TensorInfo((2, 7, 3)))
    desc = flowrt.descriptors.Split(axis=1, num_outputs=3)
    split = net.add_layer(
        "Split", desc, inputs=[x, np.array([1, 4, 2], np.int64)], name="split", num_outputs=3
    )
    for i, out in enumerate(split.outputs):
        net.add_output(f"y{i}", out)
    opt = flowrt.optimize(net, backends=["CpuAcc", "CpuRef"])
    assert opt.assignments() == {"split": "CpuAcc"}
    data = np.random.default_rng(1).standard_normal((2, 7, 3), dtype=np.float32)
    ys = flowrt.InferenceSession(opt).run(None, {"x": data})
    for y, e in zip(ys, np.split(data, [1, 5], axis=1), strict=True):
        np.testing.assert_array_equal(y, e)
