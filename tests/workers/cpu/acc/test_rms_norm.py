"""CpuAcc RMSNormalization against CpuRef, and through the public API."""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

import flowrt
from flowrt.registry import WorkloadInfo
from flowrt.types import TensorInfo
from flowrt.workers.cpu.acc.kernels import load_all as acc_kernels
from flowrt.workers.cpu.acc.kernels.rms_norm import MIN_SLICE
from flowrt.workers.cpu.ref.kernels import load_all as ref_kernels


def _data(seed, shape):
    return np.random.default_rng(seed).uniform(-10, 10, shape).astype(np.float32)


def _run_both(x, scale, workers, constant=True, given_out=False, **attributes):
    desc = flowrt.descriptors.RMSNormalization(**attributes)
    expected = np.asarray(ref_kernels()["RMSNormalization"](desc, x, scale))
    info = WorkloadInfo(
        "rms", "RMSNormalization", desc, (TensorInfo.of(x), TensorInfo.of(scale)), (TensorInfo.of(expected),),
        (None, scale if constant else None),
    )  # fmt: skip
    assert acc_kernels()["RMSNormalization"].supports(info).supported
    kernel = acc_kernels()["RMSNormalization"](info, workers)
    outputs = [np.full_like(expected, np.nan)] if given_out else None
    (got,) = kernel.execute([x, scale], outputs)
    if given_out:
        assert got is outputs[0]
    assert got.dtype == np.float32 and got.shape == x.shape
    return kernel, got, expected


@settings(max_examples=25, deadline=None)
@given(
    shape=st.lists(st.integers(1, 12), min_size=1, max_size=4),
    data=st.data(),
    constant=st.booleans(),
    workers=st.integers(1, 3),
    given_out=st.booleans(),
)
def test_rms_normalization_matches_cpuref(shape, data, constant, workers, given_out):
    axis = data.draw(st.integers(-len(shape), len(shape) - 1))
    normalized = tuple(shape[axis:])
    # The scale may broadcast over the leading normalized dims.
    scale = _data(1, normalized[data.draw(st.integers(0, len(normalized) - 1)) :])
    epsilon = data.draw(st.sampled_from([1e-6, 1e-2]))
    _, got, expected = _run_both(
        _data(0, shape), scale, workers, constant, given_out, axis=axis, epsilon=epsilon
    )
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)


def test_rows_split_across_workers_only_when_worth_it():
    x, scale = _data(2, (64, 1024)), _data(3, (1024,))
    kernel, got, expected = _run_both(x, scale, workers=2)
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)
    assert kernel.bounds(64, 1024).tolist() == [0, 32, 64]
    assert kernel.bounds(MIN_SLICE // 1024, 1024).tolist() == [0, MIN_SLICE // 1024]


def test_non_float32_is_declined_with_a_reason():
    support = flowrt.backend_registry().get("CpuAcc").layer_support()
    desc = flowrt.descriptors.RMSNormalization()
    for x, scale in [("float64", "float64"), ("float32", "float16")]:
        answer = support.is_layer_supported(
            "RMSNormalization",
            desc,
            [TensorInfo((2, 4), x), TensorInfo((4,), scale)],
            [TensorInfo((2, 4), scale)],
        )
        assert not answer.supported and "float32" in answer.reason


def test_rms_normalization_layer_runs_on_cpuacc_as_on_cpuref():
    net = flowrt.Network()
    x = net.add_input("x", TensorInfo((3, 7, 32)))
    scale = np.linspace(0.5, 2, 32, dtype=np.float32)
    net.add_output(
        "y",
        net.add_layer(
            "RMSNormalization", flowrt.descriptors.RMSNormalization(epsilon=1e-6), [x, scale], name="rms"
        ),
    )
    opt = flowrt.optimize(net, backends=["CpuAcc", "CpuRef"])
    assert opt.assignments() == {"rms": "CpuAcc"}
    data = _data(4, (3, 7, 32))
    (got,) = flowrt.InferenceSession(opt).run(None, {"x": data})
    (expected,) = flowrt.InferenceSession(net, backends=["CpuRef"]).run(None, {"x": data})
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)
