"""CpuAcc Where against CpuRef: the condition, X and Y broadcast every way, float32 and int64,
planned outputs; a GPT causal mask in a network."""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import flowrt
from flowrt.registry import WorkloadInfo
from flowrt.types import TensorInfo
from flowrt.workers.cpu.acc.kernels import load_all as acc_kernels
from flowrt.workers.cpu.ref.kernels import load_all as ref_kernels


def _run_both(condition, x, y, workers=2, given_outputs=False):
    inputs = [condition, x, y]
    expected = ref_kernels()["Where"](None, *inputs)
    infos = tuple(TensorInfo.of(a) for a in inputs)
    info = WorkloadInfo("layer", "Where", None, infos, (TensorInfo.of(expected),), (None,) * 3)
    outputs = [np.empty(expected.shape, expected.dtype)] if given_outputs else None
    (got,) = acc_kernels()["Where"](info, workers).execute(inputs, outputs)
    if given_outputs:
        assert got is outputs[0]
    assert got.dtype == expected.dtype and got.shape == expected.shape
    return got, expected


@st.composite
def where_case(draw):
    """Three shapes that broadcast together: each operand keeps a dim or has 1 there, and may
    drop leading dims."""
    dims = draw(hnp.array_shapes(min_dims=0, max_dims=4, min_side=0, max_side=5))
    shapes = []
    for _ in range(3):
        shape = [d if draw(st.booleans()) else 1 for d in dims]
        shapes.append(tuple(shape[draw(st.integers(0, len(shape))) :]))
    dtype = draw(st.sampled_from([np.float32, np.float32, np.int64]))
    condition = draw(hnp.arrays(np.bool_, shapes[0]))
    return condition, draw(hnp.arrays(dtype, shapes[1])), draw(hnp.arrays(dtype, shapes[2]))


@settings(max_examples=25, deadline=None)
@given(case=where_case(), workers=st.integers(1, 3), given_outputs=st.booleans())
def test_where_matches_cpuref(case, workers, given_outputs):
    got, expected = _run_both(*case, workers, given_outputs)
    np.testing.assert_array_equal(got, expected)


def test_large_selects_split_across_workers():
    rng = np.random.default_rng(0)
    scores = rng.standard_normal((2, 4, 96, 96), dtype=np.float32)
    causal = np.tril(np.ones((96, 96), bool))[None, None]
    got, expected = _run_both(causal, scores, np.float32(-np.inf), workers=3, given_outputs=True)
    np.testing.assert_array_equal(got, expected)
    mask = rng.random(scores.shape) < 0.5
    got, expected = _run_both(mask, scores, -scores, workers=2)  # equal shapes: flat rows
    np.testing.assert_array_equal(got, expected)


def test_causal_mask_runs_on_cpuacc():
    seq = 6
    net = flowrt.Network()
    x = net.add_input("scores", TensorInfo((2, 3, seq, seq)))
    causal = np.tril(np.ones((1, 1, seq, seq), bool))
    masked = net.add_layer("Where", inputs=[causal, x, np.array(-1e4, np.float32)], name="mask")
    net.add_output("y", masked)
    opt = flowrt.optimize(net, backends=["CpuAcc", "CpuRef"])
    assert opt.assignments() == {"mask": "CpuAcc"}
    data = np.random.default_rng(1).standard_normal((2, 3, seq, seq), dtype=np.float32)
    (y,) = flowrt.InferenceSession(opt).run(None, {"scores": data})
    np.testing.assert_array_equal(y, np.where(causal, data, np.float32(-1e4)))
