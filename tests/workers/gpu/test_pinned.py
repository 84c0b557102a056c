"""Feeds and bound outputs in page-locked host memory (``LoadedNetwork.pinned_array``): GpuAcc
copies them straight to and from the device, with no staging copy."""

import gc

import numpy as np
import pytest

import flowrt
from flowrt.errors import ArgumentError, BackendError
from flowrt.workers.gpu.scratch import ScratchSet


@pytest.fixture
def staged(monkeypatch):
    """The bytes each run's transfers staged, run by run (``ScratchSet.stage`` counted)."""
    calls: list[int] = []
    stage = ScratchSet.stage

    def counted(self, nbytes):
        calls.append(nbytes)
        return stage(self, nbytes)

    monkeypatch.setattr(ScratchSet, "stage", counted)
    return calls


@pytest.mark.parametrize("half", [False, True], ids=["float32", "half storage"])
async def test_pinned_feeds_and_outputs_cross_with_no_staging_copy(
    gpu, conv_network, conv_net_reference, staged, half
):
    feeds, expected = conv_net_reference
    options = flowrt.OptimizerOptions(reduce_fp32_to_fp16=half)
    opt = flowrt.optimize(conv_network(), backends=["GpuAcc", "CpuRef"], options=options)
    tolerance = {"rtol": 1e-2, "atol": 1e-3} if half else {"rtol": 1e-5, "atol": 1e-6}
    async with flowrt.Runtime(cpu_workers=1) as rt:
        model = await rt.load(opt)
        out = await model.run(feeds)  # ordinary arrays: both cross through staging
        assert len(staged) == 2
        np.testing.assert_allclose(out["y"], expected["y"], **tolerance)
        x = model.pinned_array(feeds["x"].shape)
        y = model.pinned_array(expected["y"].shape, expected["y"].dtype)
        assert x.flags.c_contiguous and x.dtype == np.float32 and x.shape == feeds["x"].shape
        reference = await rt.load(flowrt.optimize(conv_network(), backends=["CpuRef"]))
        for scale in (1.0, -1.0):  # the same arrays again, with new values
            staged.clear()
            x[...] = feeds["x"] * scale
            got = await model.run({"x": x}, outputs={"y": y})
            assert got["y"] is y and staged == []
            if scale == 1.0:
                np.testing.assert_array_equal(y, out["y"])  # the same bytes as through staging
            np.testing.assert_allclose(y, (await reference.run({"x": x}))["y"], **tolerance)


async def test_a_view_of_a_pinned_array_is_pinned_and_the_memory_goes_with_the_array(gpu):
    x = gpu.pinned_array((4, 6))
    assert gpu.is_pinned(x) and gpu.is_pinned(x[1:3]) and gpu.is_pinned(x.reshape(-1))
    assert not gpu.is_pinned(np.empty((4, 6), np.float32)) and not gpu.is_pinned(x.copy())
    held = len(gpu._pinned)
    del x
    gc.collect()
    assert len(gpu._pinned) == held - 1


async def test_pinned_array_refuses_a_network_off_the_gpu_and_bad_arguments(gpu, conv_network):
    async with flowrt.Runtime(cpu_workers=1) as rt:
        on_cpu = await rt.load(flowrt.optimize(conv_network(), backends=["CpuRef"]))
        with pytest.raises(BackendError, match=r"runs no layer on a device with pinned host memory.*CpuRef"):
            on_cpu.pinned_array((1, 3, 16, 16))
        model = await rt.load(flowrt.optimize(conv_network(), backends=["GpuAcc", "CpuRef"]))
        with pytest.raises(ArgumentError, match=r"shape must be an int >= 0, got -1"):
            model.pinned_array((2, -1))
        with pytest.raises(ArgumentError, match=r"shape must be a sequence of ints >= 0, got 'x' \(str\)"):
            model.pinned_array("x")
        with pytest.raises(ArgumentError, match=r"dtype must be a numpy dtype, got 'no such type'"):
            model.pinned_array((2,), "no such type")
        assert model.pinned_array(5).shape == (5,) and model.pinned_array((0, 3)).size == 0
