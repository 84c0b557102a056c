"""CpuAcc Cast and CastLike against CpuRef: the common pairs of bool, integers and floats,
float16 with float32, planned outputs; exotic pairs declined; a mask cast in a network."""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import flowrt
from flowrt.registry import WorkloadInfo
from flowrt.types import TensorInfo
from flowrt.workers.cpu.acc.kernels import load_all as acc_kernels
from flowrt.workers.cpu.ref.kernels import load_all as ref_kernels

# TensorProto numbers: FLOAT 1, UINT8 2, INT32 6, INT64 7, BOOL 9, FLOAT16 10, DOUBLE 11.
TO = {np.float32: 1, np.uint8: 2, np.int32: 6, np.int64: 7, np.bool_: 9, np.float16: 10, np.float64: 11}
# What transformer and vision exports cast: masks, shape arithmetic, image bytes, half weights.
PAIRS = [
    (np.bool_, np.float32), (np.float32, np.bool_), (np.int64, np.float32), (np.float32, np.int64),
    (np.int64, np.int32), (np.int32, np.int64), (np.uint8, np.float32), (np.float16, np.float32),
    (np.float32, np.float16), (np.float32, np.float64), (np.bool_, np.int64),
]  # fmt: skip


def _run_both(x, to, workers=2, given_outputs=False, like=False):
    if like:
        kind, desc, inputs = "CastLike", flowrt.descriptors.CastLike(), [x, np.zeros(1, to)]
    else:
        kind, desc, inputs = "Cast", flowrt.descriptors.Cast(to=TO[to]), [x]
    expected = ref_kernels()[kind](desc, *inputs)
    infos = tuple(TensorInfo.of(a) for a in inputs)
    info = WorkloadInfo("layer", kind, desc, infos, (TensorInfo.of(expected),), (None,) * len(inputs))
    assert acc_kernels()[kind].supports(info).supported
    outputs = [np.empty(expected.shape, expected.dtype)] if given_outputs else None
    (got,) = acc_kernels()[kind](info, workers).execute(inputs, outputs)
    if given_outputs:
        assert got is outputs[0]
    assert got.dtype == expected.dtype == np.dtype(to) and got.shape == expected.shape
    return got, expected


@st.composite
def cast_case(draw):
    source, target = draw(st.sampled_from(PAIRS))
    shape = hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=6)
    if np.dtype(source).kind == "f":
        # within every target's range: a float beyond an integer type's is undefined in ONNX
        halves = st.sampled_from([0.5, -0.5, -0.0])  # truncation toward zero
        elements = st.floats(-100, 100, width=np.dtype(source).itemsize * 8) | halves
        if np.dtype(target).kind in "fb":
            elements = elements | st.sampled_from([np.nan, np.inf, -np.inf])
    else:
        elements = None
    return draw(hnp.arrays(source, shape, elements=elements)), target


@settings(max_examples=25, deadline=None)
@given(case=cast_case(), given_outputs=st.booleans(), like=st.booleans())
def test_cast_matches_cpuref(case, given_outputs, like):
    x, to = case
    got, expected = _run_both(x, to, 2, given_outputs, like)
    np.testing.assert_array_equal(got, expected)


def test_large_cast_spreads_over_workers_and_wraps_integers():
    x = np.random.default_rng(0).integers(-(2**40), 2**40, 100_000)
    got, expected = _run_both(x, np.int32, workers=3, given_outputs=True)
    np.testing.assert_array_equal(got, expected)


def test_exotic_pairs_are_declined():
    support = flowrt.backend_registry().get("CpuAcc").layer_support()
    for source, to in [("float16", 7), ("int16", 1), ("float64", 10)]:
        answer = support.is_layer_supported(
            "Cast", flowrt.descriptors.Cast(to=to), [TensorInfo((3,), source)], [None]
        )
        assert not answer.supported and "float16 with float32" in answer.reason


def test_mask_casts_run_on_cpuacc():
    net = flowrt.Network()
    x = net.add_input("mask", TensorInfo((2, 5), "bool"))
    cast = net.add_layer("Cast", flowrt.descriptors.Cast(to=7), inputs=[x], name="cast")
    like = net.add_layer("CastLike", inputs=[cast, np.zeros(1, np.float32)], name="like")
    net.add_output("y", like)
    opt = flowrt.optimize(net, backends=["CpuAcc", "CpuRef"])
    assert opt.assignments() == {"cast": "CpuAcc", "like": "CpuAcc"}
    mask = np.random.default_rng(1).random((2, 5)) < 0.5
    (y,) = flowrt.InferenceSession(opt).run(None, {"mask": mask})
    assert y.dtype == np.float32
    np.testing.assert_array_equal(y, mask.astype(np.float32))
