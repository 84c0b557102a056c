"""CpuAcc Reshape, Flatten, Squeeze and Unsqueeze (views, no copy), and shufflenet on CpuAcc."""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import flowrt
from flowrt.models import expected_outputs, expected_tolerance, light_model, pattern_input
from flowrt.registry import WorkloadInfo
from flowrt.types import TensorInfo
from flowrt.workers.cpu.acc.kernels import load_all as acc_kernels
from flowrt.workers.cpu.ref.kernels import load_all as ref_kernels


def _run_both(kind, inputs, **attributes):
    desc = getattr(flowrt.descriptors, kind)(**attributes)
    expected = ref_kernels()[kind](desc, *inputs)
    infos = tuple(TensorInfo.of(x) for x in inputs)
    info = WorkloadInfo("layer", kind, desc, infos, (TensorInfo.of(expected),))
    (got,) = acc_kernels()[kind](info, 2).execute(inputs)
    return got, expected


@settings(max_examples=30, deadline=None)
@given(
    x=hnp.arrays(np.float32, hnp.array_shapes(min_dims=1, max_dims=4, max_side=5)),
    data=st.data(),
)
def test_view_kinds_match_cpuref_and_share_the_input(x, data):
    kind = data.draw(st.sampled_from(["Reshape", "Flatten", "Squeeze", "Unsqueeze"]))
    if kind == "Reshape":
        inputs, attributes = [x, np.array([-1, x.shape[-1]], np.int64)], {}
    elif kind == "Flatten":
        inputs, attributes = [x], {"axis": data.draw(st.integers(-x.ndim, x.ndim))}
    elif kind == "Squeeze":
        inputs, attributes = [x], {}
    else:
        inputs, attributes = [x, np.array([0, -1], np.int64)], {}
    got, expected = _run_both(kind, inputs, **attributes)
    assert got.shape == expected.shape
    np.testing.assert_array_equal(got, expected)
    assert np.shares_memory(got, x)


def test_reshape_takes_any_data_type():
    support = flowrt.backend_registry().get("CpuAcc").layer_support()
    answer = support.is_layer_supported(
        "Reshape", None, [TensorInfo((2, 3), "int64"), TensorInfo((1,), "int64")], [TensorInfo((6,), "int64")]
    )
    assert answer.supported
    got, _ = _run_both("Reshape", [np.arange(6), np.array([3, 2])])
    assert got.shape == (3, 2) and got.dtype == np.int64


def test_shufflenet_runs_its_shuffles_and_residuals_on_cpuacc():
    path = light_model("shufflenet")
    opt = flowrt.optimize(flowrt.onnx.load(path), backends=["CpuAcc", "CpuRef"])
    by_kind = {}
    for layer in opt.graph:
        if layer.backend:
            by_kind.setdefault(layer.kind, set()).add(layer.backend)
    for kind in ("Reshape", "Transpose", "Concat", "Sum"):
        assert by_kind[kind] == {"CpuAcc"}, kind
    sess = flowrt.InferenceSession(opt)
    feeds = {a.name: pattern_input(TensorInfo(a.shape)) for a in sess.get_inputs()}
    (y,) = sess.run(None, feeds)
    np.testing.assert_allclose(y, expected_outputs(path)[0], **expected_tolerance(path))
