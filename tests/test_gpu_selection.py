"""Which OpenCL device GpuAcc runs on, through the public API: a GPU when none is named, a CPU
OpenCL device (PoCL's) only when named, and GpuAcc asked for where it cannot run an error
that says what the machine has, never a silent fallback to the next backend."""

from __future__ import annotations

import re

import numpy as np
import pytest
from ortmodels import relu_model

import flowrt
import flowrt.workers.gpu.device as opencl
from flowrt import defaults
from flowrt.errors import BackendError
from flowrt.types import TensorInfo

X = np.linspace(-2, 2, 16, dtype=np.float32).reshape(2, 8)
CPU_ONLY = not opencl.unavailable_reason() and not defaults.gpu_device_present()
needs_cpu_only_opencl = pytest.mark.skipif(
    not CPU_ONLY, reason="needs OpenCL that shows only CPU devices (PoCL, as on CI)"
)


def _network() -> flowrt.Network:
    """x[2, 8] + b -> Relu -> y: two layers GpuAcc takes (the Relu fused into the Add)."""
    net = flowrt.Network()
    x = net.add_input("x", TensorInfo((2, 8)))
    bias = np.linspace(-1, 1, 8, dtype=np.float32)
    add = net.add_layer("Add", inputs=[x, bias], name="add")
    net.add_output("y", net.add_layer("Relu", inputs=[add], name="relu"))
    return net


def _cpuref() -> np.ndarray:
    with flowrt.InferenceSession(_network(), backends="CpuRef") as sess:
        return sess.run(None, {"x": X})[0]


@pytest.fixture
def unnamed(monkeypatch):
    """No device named through the environment."""
    monkeypatch.delenv(opencl.DEVICE_ENV, raising=False)


@pytest.fixture
def no_opencl(monkeypatch, unnamed):
    """This process without OpenCL, as where pyopencl is not installed; the default list's
    GPU probe is asked afresh and forgotten afterwards."""
    monkeypatch.setattr(opencl, "cl", None)
    monkeypatch.setattr(opencl, "_IMPORT_ERROR", "pyopencl failed to import (ImportError: blocked)")
    opencl.gpu_device_present.cache_clear()
    yield
    opencl.gpu_device_present.cache_clear()


@needs_cpu_only_opencl
async def test_gpuacc_unnamed_on_a_cpu_only_machine_is_refused_saying_how_to_name_the_device(unnamed):
    first = opencl.describe_devices()[0]
    has = re.escape(f"this machine has only a CPU OpenCL device: {first.index} '{first.name}'")
    with pytest.raises(BackendError, match=rf"^GpuAcc needs an OpenCL GPU device, and {has}"):
        flowrt.InferenceSession(_network(), backends=["GpuAcc", "CpuRef"])
    opt = flowrt.optimize(_network(), backends=["GpuAcc", "CpuRef"])  # a plan: no device yet
    assert opt.assignments() == {"add": "GpuAcc"}
    async with flowrt.Runtime(cpu_workers=1) as rt:
        with pytest.raises(BackendError, match=rf"name it: {opencl.DEVICE_ENV}={first.index} or Runtime"):
            await rt.load(opt)
    # OpenCLExecutionProvider says the same of the machine, with its own way to name a device.
    with pytest.raises(BackendError, match=rf"^OpenCLExecutionProvider needs .*, and {has}.*'device'"):
        flowrt.InferenceSession(_network(), providers=["OpenCLExecutionProvider"])


@needs_cpu_only_opencl
async def test_a_named_cpu_device_runs_gpuacc_and_matches_cpuref(monkeypatch):
    expected = _cpuref()
    first = opencl.describe_devices()[0]
    monkeypatch.setenv(opencl.DEVICE_ENV, first.index)
    with flowrt.InferenceSession(_network(), backends=["GpuAcc", "CpuRef"]) as sess:
        assert sess.optimized.assignments() == {"add": "GpuAcc"}
        assert sess.get_providers() == ["OpenCLExecutionProvider", "CPUExecutionProvider"]
        np.testing.assert_allclose(sess.run(None, {"x": X})[0], expected, rtol=1e-6)
    monkeypatch.delenv(opencl.DEVICE_ENV)
    opt = flowrt.optimize(_network(), backends=["GpuAcc", "CpuRef"])
    async with flowrt.Runtime(cpu_workers=1, opencl_device=first.name) as rt:
        got = await (await rt.load(opt)).run({"x": X})
    np.testing.assert_allclose(got["y"], expected, rtol=1e-6)


def test_gpuacc_asked_for_without_opencl_is_an_error_not_a_cpu_fallback(no_opencl):
    said = r"^GpuAcc needs an OpenCL GPU device, and this machine has no OpenCL device \(pyopencl failed"
    with pytest.raises(BackendError, match=said + r".*install an OpenCL driver"):
        flowrt.optimize(_network(), backends=["GpuAcc", "CpuRef"])
    with pytest.raises(BackendError, match=said):
        flowrt.InferenceSession(_network(), backends=["GpuAcc", "CpuRef"])
    with pytest.raises(BackendError, match="^OpenCLExecutionProvider needs an OpenCL GPU device, and"):
        flowrt.InferenceSession(_network(), providers=["OpenCLExecutionProvider"])


def test_the_defaults_run_on_cpuacc_without_opencl(no_opencl):
    assert flowrt.optimize(_network()).backends == ["CpuAcc", "CpuRef"]
    with flowrt.InferenceSession(relu_model().SerializeToString()) as sess:
        assert sess.get_providers() == ["CPUExecutionProvider"]
        assert sess.optimized.assignments() == {"relu": "CpuAcc"}
        x = X[:, :3]
        np.testing.assert_array_equal(sess.run(None, {"x": x})[0], np.maximum(x, 0))
