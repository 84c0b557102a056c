"""GpuAcc's 3x3 stride-1 Conv by Winograd's F(2x2, 3x3): where the cost model takes it, and its
results against CpuRef (the layer alone, in a network, in a batching stream)."""

import numpy as np
import pytest
from fusedruns import alone_and_batched, cpuref_output, steady_launches

import flowrt
from flowrt.registry import FusedActivation
from flowrt.types import TensorInfo
from flowrt.workers.gpu.kernels import conv as conv_module
from flowrt.workers.gpu.kernels.winograd import winograd_pays

H200_UNITS = 132


def test_the_cost_model_takes_it_for_large_gemms_not_for_launch_bound_ones():
    # resnet50's 3x3 convolutions of 128 channels at 28x28 and 256 at 14x14: batch 8
    # multiplies enough to pay for two more launches, batch 1 does not.
    assert winograd_pays((8, 256, 14, 14), 256, (14, 14), H200_UNITS)
    assert winograd_pays((8, 128, 28, 28), 128, (28, 28), H200_UNITS)
    assert not winograd_pays((1, 256, 14, 14), 256, (14, 14), H200_UNITS)
    assert not winograd_pays((1, 128, 28, 28), 128, (28, 28), H200_UNITS)
    assert not winograd_pays((1, 8, 8, 8), 8, (8, 8), H200_UNITS)


@pytest.fixture
def winograd_everywhere(monkeypatch):
    """Every convolution that F(2x2, 3x3) can run takes it, whatever its cost."""
    monkeypatch.setattr(conv_module, "winograd_pays", lambda *args: True)


def _normal(rng, *shape):
    return rng.standard_normal(shape).astype(np.float32)


@pytest.mark.parametrize(
    "x_shape, outputs, desc",
    [
        ((2, 16, 12, 12), 24, flowrt.descriptors.Conv(pads=(1, 1, 1, 1))),
        ((1, 5, 9, 7), 3, flowrt.descriptors.Conv(pads=(1, 1, 1, 1))),  # odd sides: partial tiles
        ((1, 8, 10, 9), 6, flowrt.descriptors.Conv(pads=(0, 2, 1, 0))),  # uneven padding
        ((1, 8, 9, 9), 4, flowrt.descriptors.Conv()),  # no padding
        ((1, 8, 9, 9), 4, flowrt.descriptors.Conv(auto_pad="SAME_UPPER")),
    ],
)
def test_winograd_conv_matches_cpuref(run_both, winograd_everywhere, x_shape, outputs, desc):
    rng = np.random.default_rng(sum(x_shape))
    x, w, b = _normal(rng, *x_shape), _normal(rng, outputs, x_shape[1], 3, 3), _normal(rng, outputs)
    (got,), (expected,) = run_both("Conv", desc, [x, w, b], constant=(1, 2))
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4)
    (got,), (expected,) = run_both("Conv", desc, [x, w], constant=(1,))  # no bias
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4)


def test_winograd_adds_the_residual_before_the_activation(run_both, winograd_everywhere):
    rng = np.random.default_rng(5)
    x, w, b, z = _normal(rng, 2, 6, 8, 8), _normal(rng, 7, 6, 3, 3), _normal(rng, 7), _normal(rng, 2, 7, 8, 8)
    desc = flowrt.descriptors.Conv(pads=(1, 1, 1, 1))
    (got,), (expected,) = run_both("FusedConv", desc, [x, w, b, z], constant=(1, 2))
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4)
    relu = FusedActivation("Relu")
    (got,), (expected,) = run_both("FusedConv", desc, [x, w, b, z], constant=(1, 2), activation=relu)
    np.testing.assert_allclose(got, np.maximum(expected, 0), rtol=1e-4, atol=1e-4)


def _network(batch: int = 1) -> flowrt.Network:
    """x -> 3x3 Conv + Relu -> 3x3 stride-2 Conv: the first can run by Winograd, the second not."""
    rng = np.random.default_rng(2)
    net = flowrt.Network()
    x = net.add_input("x", TensorInfo((batch, 8, 10, 10)))
    w1, b1, w2 = _normal(rng, 12, 8, 3, 3), _normal(rng, 12), _normal(rng, 4, 12, 3, 3)
    y = net.add_layer("Conv", flowrt.descriptors.Conv(pads=(1, 1, 1, 1)), [x, w1, b1], name="same")
    y = net.add_layer("Relu", inputs=[y], name="relu")
    strided = flowrt.descriptors.Conv(pads=(1, 1, 1, 1), strides=(2, 2))
    net.add_output("out", net.add_layer("Conv", strided, [y, w2], name="strided"))
    return net


def test_a_network_runs_its_3x3_stride_1_conv_in_three_launches(gpu, winograd_everywhere):
    feeds = {"x": _normal(np.random.default_rng(0), 1, 8, 10, 10)}
    opt = flowrt.optimize(_network(), backends=["GpuAcc", "CpuRef"])
    assert set(opt.assignments().values()) == {"GpuAcc"}
    launches, out = steady_launches(opt, feeds)
    same = next(name for name in launches if name.startswith("same"))
    assert launches[same] == 3  # tiles in, the 16 GEMMs, tiles out (with the bias and Relu)
    assert launches["strided"] == 1  # stride 2: the implicit GEMM
    np.testing.assert_allclose(out, cpuref_output(_network(), feeds), rtol=1e-4, atol=1e-4)


def test_without_it_the_same_network_launches_one_gemm_a_conv(gpu, monkeypatch):
    monkeypatch.setattr(conv_module, "winograd_pays", lambda *args: False)
    feeds = {"x": _normal(np.random.default_rng(0), 1, 8, 10, 10)}
    launches, out = steady_launches(flowrt.optimize(_network(), backends=["GpuAcc", "CpuRef"]), feeds)
    assert sorted(launches.values()) == [1, 1]
    np.testing.assert_allclose(out, cpuref_output(_network(), feeds), rtol=1e-4, atol=1e-4)


def test_a_batching_stream_gets_each_samples_own_result(gpu, winograd_everywhere):
    """Each batch size is its own plan of tiles: four samples batched match each alone."""
    rng = np.random.default_rng(4)
    feeds = [{"x": _normal(rng, 1, 8, 10, 10)} for _ in range(4)]
    alone, batched, counts = alone_and_batched(
        flowrt.optimize(_network(), backends=["GpuAcc", "CpuRef"]), feeds
    )
    assert max(counts) > 1
    for one, together, f in zip(alone, batched, feeds):
        np.testing.assert_allclose(together, one, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(one, cpuref_output(_network(), f), rtol=1e-4, atol=1e-4)
