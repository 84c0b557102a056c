"""CpuAcc activations against CpuRef, and CpuAcc in a whole model with fallback to CpuRef."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import flowrt
from flowrt.registry import WorkloadInfo
from flowrt.types import TensorInfo
from flowrt.workers.cpu.acc.kernels import load_all as acc_kernels
from flowrt.workers.cpu.acc.kernels.activation import MIN_SLICE
from flowrt.workers.cpu.ref.kernels import load_all as ref_kernels

KINDS = ["Relu", "LeakyRelu", "Sigmoid", "Tanh"]


def _run_both(kind, x, workers, **attributes):
    desc = getattr(flowrt.descriptors, kind)(**attributes)
    info = WorkloadInfo("layer", kind, desc, (TensorInfo.of(x),), (TensorInfo.of(x),), (None,))
    kernel = acc_kernels()[kind](info, workers)
    (got,) = kernel.execute([x])
    expected = ref_kernels()[kind](desc, x)
    return kernel, got, np.asarray(expected)


@settings(max_examples=40, deadline=None)
@given(
    kind=st.sampled_from(KINDS),
    x=hnp.arrays(
        np.float32,
        hnp.array_shapes(min_dims=1, max_dims=4, max_side=40),
        elements=st.floats(-100, 100, width=32),
    ),
    workers=st.integers(1, 4),
)
def test_activations_match_cpuref(kind, x, workers):
    _, got, expected = _run_both(kind, x, workers)
    assert got.dtype == np.float32 and got.shape == x.shape
    np.testing.assert_allclose(got, expected, rtol=2e-6, atol=1e-7)


@pytest.mark.parametrize("alpha", [0.01, 0.2, 1.5])
def test_leaky_relu_uses_its_slope(alpha):
    x = np.linspace(-3, 3, 101, dtype=np.float32)
    _, got, expected = _run_both("LeakyRelu", x, 2, alpha=alpha)
    np.testing.assert_allclose(got, expected, rtol=1e-6)


def test_sigmoid_saturates_without_overflow():
    x = np.array([-1e4, -100, 0, 100, 1e4], np.float32)
    with np.errstate(over="raise"):
        _, got, _ = _run_both("Sigmoid", x, 1)
    np.testing.assert_allclose(got, [0, 0, 0.5, 1, 1], atol=1e-30)


def test_window_splits_into_one_slice_per_worker_only_when_worth_it():
    big = np.zeros(4 * MIN_SLICE, np.float32)
    kernel, _, _ = _run_both("Relu", big, 2)
    assert kernel.bounds(big.size).tolist() == [0, 2 * MIN_SLICE, 4 * MIN_SLICE]
    assert kernel.bounds(MIN_SLICE + 1).tolist() == [0, MIN_SLICE + 1]


def test_non_float32_is_declined_with_a_reason():
    support = flowrt.backend_registry().get("CpuAcc").layer_support()
    answer = support.is_layer_supported(
        "Relu", None, [TensorInfo((3,), "float64")], [TensorInfo((3,), "float64")]
    )
    assert not answer.supported and "float32 only" in answer.reason
    answer = support.is_layer_supported("TopK", None, [TensorInfo((1, 1, 3, 3))], [None])
    assert answer.reason == "no CpuAcc kernel for TopK"


def test_layer_without_a_cpuacc_kernel_falls_back_visibly(capsys):
    net = flowrt.Network()
    x = net.add_input("x", TensorInfo((2, 5)))
    relu = net.add_layer("Relu", inputs=[x], name="relu")
    cumsum = net.add_layer("CumSum", inputs=[relu, np.array(1, np.int64)], name="cumsum")
    net.add_output("y", cumsum)
    opt = flowrt.optimize(net, backends=["CpuAcc", "CpuRef"])
    assert opt.assignments() == {"relu": "CpuAcc", "cumsum": "CpuRef"}
    assert opt.decisions["cumsum"].declined == {"CpuAcc": "no CpuAcc kernel for CumSum"}
    data = np.linspace(-1, 1, 10, dtype=np.float32).reshape(2, 5)
    (y,) = flowrt.InferenceSession(opt).run(None, {"x": data})
    np.testing.assert_allclose(y, np.cumsum(np.maximum(data, 0), axis=1), rtol=1e-6)
    assert "declined by CpuAcc: no CpuAcc kernel for CumSum" in opt.report()
