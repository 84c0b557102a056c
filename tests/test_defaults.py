"""One default backend list for every entry point: ``flowrt.optimize``, ``InferenceSession``
with no providers, the onnx backend and the command line all take the fastest list available
(CpuAcc, CpuRef; GpuAcc first only where OpenCL shows a real GPU), built from the registry's
default ranks. The OpenCL probe is replaced here, so these tests mean the same on a machine
with a GPU and one without."""

from __future__ import annotations

import os
import subprocess
import sys
from types import SimpleNamespace

import numpy as np
import pytest
from fakes import PartialBackend
from ortmodels import relu_model

import flowrt
import flowrt.workers.gpu.device as opencl_device
from flowrt import defaults
from flowrt.errors import ArgumentError, BackendError
from flowrt.onnx import backend as onnx_backend
from flowrt.registry import DefaultRank

X = np.array([[-1, 2, -3], [4, -5, 6]], np.float32)


@pytest.fixture
def opencl(monkeypatch):
    """``opencl(gpu=...)``: what the OpenCL probe answers. With a GPU, "GpuAcc" is a stand-in
    that declines every layer, so nothing here needs OpenCL."""
    monkeypatch.delenv(opencl_device.DEVICE_ENV, raising=False)

    def show(gpu: bool) -> None:
        monkeypatch.setattr(opencl_device, "gpu_device_present", lambda: gpu)
        if gpu:
            factories = flowrt.backend_registry()._factories
            monkeypatch.setitem(factories, "GpuAcc", lambda: PartialBackend("GpuAcc", set()))

    return show


def _relu_network() -> flowrt.Network:
    return flowrt.onnx.load(relu_model())


def test_optimize_without_backends_takes_cpuacc_then_cpuref_without_a_gpu(opencl):
    opencl(gpu=False)
    opt = flowrt.optimize(_relu_network())
    assert opt.backends == ["CpuAcc", "CpuRef"]
    assert opt.backend_counts() == {"CpuAcc": 1}


def test_optimize_without_backends_puts_gpuacc_first_where_opencl_shows_a_gpu(opencl):
    opencl(gpu=True)
    opt = flowrt.optimize(_relu_network())
    assert opt.backends == ["GpuAcc", "CpuAcc", "CpuRef"]
    assert opt.backend_counts() == {"CpuAcc": 1}  # the stand-in GpuAcc declined the Relu


def test_optimize_with_backends_named_keeps_them(opencl):
    opencl(gpu=True)
    assert flowrt.optimize(_relu_network(), backends=["CpuRef"]).backends == ["CpuRef"]


def test_optimize_and_a_session_take_one_backend_id_as_a_string_never_split():
    assert flowrt.optimize(_relu_network(), backends="CpuAcc").backend_counts() == {"CpuAcc": 1}
    with flowrt.InferenceSession(relu_model().SerializeToString(), backends="CpuAcc") as sess:
        assert sess.optimized.backends == ["CpuAcc"]
    for call in (
        lambda: flowrt.optimize(_relu_network(), backends="CpuAcc,CpuRef"),
        lambda: flowrt.InferenceSession(relu_model().SerializeToString(), backends="CpuAcc,CpuRef"),
    ):
        with pytest.raises(BackendError, match="backend 'CpuAcc,CpuRef' is not registered"):
            call()


def test_optimize_default_leaves_out_what_the_registry_given_lacks(opencl):
    opencl(gpu=False)
    registry = flowrt.BackendRegistry()
    registry.register("CpuRef", flowrt.RefBackend)
    assert flowrt.optimize(_relu_network(), registry=registry).backends == ["CpuRef"]
    with pytest.raises(
        BackendError, match=r"no backend of the default list \(CpuAcc, CpuRef\) is registered"
    ):
        flowrt.optimize(_relu_network(), registry=flowrt.BackendRegistry())


def test_a_session_without_providers_runs_on_cpuacc_then_cpuref_without_a_gpu(opencl):
    opencl(gpu=False)
    with flowrt.InferenceSession(relu_model().SerializeToString()) as sess:
        assert sess.optimized.backends == ["CpuAcc", "CpuRef"]
        assert sess.get_providers() == ["CPUExecutionProvider"]
        np.testing.assert_array_equal(sess.run(None, {"x": X})[0], np.maximum(X, 0))


def test_a_session_without_providers_puts_gpuacc_first_only_where_opencl_shows_a_gpu(opencl):
    opencl(gpu=True)
    model = relu_model().SerializeToString()
    with flowrt.InferenceSession(model) as default, flowrt.InferenceSession(model, providers=[]) as empty:
        assert default.optimized.backends == empty.optimized.backends == ["GpuAcc", "CpuAcc", "CpuRef"]
        assert default.get_providers() == ["OpenCLExecutionProvider", "CPUExecutionProvider"]
        np.testing.assert_array_equal(default.run(None, {"x": X})[0], np.maximum(X, 0))
    # Naming the CPU provider still leaves GpuAcc out.
    with flowrt.InferenceSession(model, providers=["CPUExecutionProvider"]) as cpu:
        assert cpu.optimized.backends == ["CpuAcc", "CpuRef"]


def test_the_onnx_backend_runs_on_the_cpu_default_even_where_opencl_shows_a_gpu(opencl):
    opencl(gpu=True)
    rep = onnx_backend.prepare(relu_model())
    with rep.session:
        assert rep.session.optimized.backends == ["CpuAcc", "CpuRef"]
        np.testing.assert_array_equal(rep.run(X)[0], np.maximum(X, 0))


def test_the_gpu_probe_runs_once_per_process(monkeypatch):
    calls = []
    monkeypatch.setattr(opencl_device, "cl", SimpleNamespace())  # an OpenCL with no platform
    monkeypatch.setattr(opencl_device, "platforms", lambda: calls.append(1) or [])
    opencl_device.gpu_device_present.cache_clear()
    try:
        assert defaults.default_backends() == defaults.default_backends() == ["CpuAcc", "CpuRef"]
        assert not defaults.gpu_device_present()
        assert calls == [1]
    finally:
        opencl_device.gpu_device_present.cache_clear()  # the next caller probes the real OpenCL


def test_a_backend_registered_with_a_default_rank_joins_the_default_list_in_rank_order(opencl):
    opencl(gpu=False)
    acme = PartialBackend("Acme_Relu", {"Relu"})
    registry = flowrt.backend_registry()
    registry.register("Acme_Relu", lambda: acme, DefaultRank(15))  # between GpuAcc and CpuAcc
    registry.register("Acme_Idle", lambda: acme, DefaultRank(5, runs_here=lambda: False))
    registry.register("Acme_Named", lambda: acme)  # no rank: only when named
    try:
        assert defaults.default_backends() == ["Acme_Relu", "CpuAcc", "CpuRef"]
        assert flowrt.optimize(_relu_network()).assignments() == {"relu": "Acme_Relu"}
        with flowrt.InferenceSession(relu_model().SerializeToString()) as sess:
            assert sess.optimized.backends == ["Acme_Relu", "CpuAcc", "CpuRef"]
            np.testing.assert_array_equal(sess.run(None, {"x": X})[0], np.maximum(X, 0))
        assert acme.calls == ["relu"]
    finally:
        for bid in ("Acme_Relu", "Acme_Idle", "Acme_Named"):
            registry.unregister(bid)
    assert defaults.default_backends() == ["CpuAcc", "CpuRef"]


def test_a_default_rank_whose_answer_raises_is_an_error_naming_the_backend():
    def broken() -> bool:
        raise OSError("driver crashed")

    registry = flowrt.BackendRegistry()
    registry.register("Acme_Broken", flowrt.RefBackend, DefaultRank(1, runs_here=broken))
    with pytest.raises(BackendError, match="'Acme_Broken' failed to say whether it runs by default: OSError"):
        registry.default_ids()
    with pytest.raises(ArgumentError, match="default_rank must be a DefaultRank or None, got 1"):
        registry.register("Acme_Int", flowrt.RefBackend, 1)


_BACKENDS_CAPABILITIES = """
from flowrt.cli import main
main(["backends"])
"""


def _capability_lines(hash_seed: str) -> list[str]:
    done = subprocess.run(
        [sys.executable, "-c", _BACKENDS_CAPABILITIES],
        env={**os.environ, "PYTHONHASHSEED": hash_seed},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return [line for line in done.stdout.splitlines() if "capabilities:" in line]


def test_flowrt_backends_prints_fused_activation_sorted_whatever_the_hash_seed():
    first, second = _capability_lines("1"), _capability_lines("2")
    assert first == second
    (cpu_acc,) = [line for line in first if line.startswith("CpuAcc ")]
    kinds = cpu_acc.split("fused_activation={", 1)[1].split("}", 1)[0].split(", ")
    assert kinds == sorted(kinds) and "Conv" in kinds
    assert "frozenset" not in "\n".join(first)
