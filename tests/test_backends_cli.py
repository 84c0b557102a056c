"""``flowrt inspect`` on a mixed preference list: assignment, substitutions, fallbacks, copies."""

from pathlib import Path

import pytest

import flowrt
import flowrt.registry.dynamic as dynamic
from flowrt.cli import main
from flowrt.models import light_model

# The sample backend runs squeezenet's Conv, Relu and Add: its layer counts are checked below.
SQUEEZENET = str(light_model("squeezenet"))


def test_inspect_shows_substitutions_fallbacks_and_copies(capsys, monkeypatch):
    from flowrt.defaults import gpu_device_present
    from flowrt.workers.gpu import device

    if device.unavailable_reason():
        pytest.skip(f"needs an OpenCL device: {device.unavailable_reason()}")
    if not gpu_device_present():  # a CPU OpenCL device (PoCL) runs GpuAcc only when named
        monkeypatch.setenv(device.DEVICE_ENV, device.describe_devices()[0].index)
    path = str(light_model("squeezenet"))
    args = [
        "inspect",
        path,
        "--backends",
        "GpuAcc,CpuAcc,CpuRef",
        "--hint",
        "n2=CpuAcc",
        "--hint",
        "n65=CpuRef",
        "--layers",
    ]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "backends (preference order): GpuAcc, CpuAcc, CpuRef" in out
    assert "GpuAcc: Conv 'n0' + Relu 'n1' -> Conv 'n0' (+Relu)" in out
    assert "  'n2' (MaxPool) -> CpuAcc: placed by layer_backend_hints" in out
    assert "  'n65' (Softmax) -> CpuRef: placed by layer_backend_hints" in out
    assert "copies (" in out
    assert "  n0:0: GpuAcc -> host (copy) for 'n2'" in out
    assert "  n2:0: CpuAcc -> GpuAcc (copy) for 'n3'" in out
    layer_rows = [line.split() for line in out.splitlines() if line.startswith("  n2 ")]
    assert layer_rows == [["n2", "MaxPool", "float32(1,", "64,", "55,", "55)", "CpuAcc"]]


def test_inspect_with_a_malformed_hint_is_a_clear_error(capsys):
    assert main(["inspect", "--hint", "n2"]) == 2
    assert "--hint expects LAYER=BACKEND, got 'n2'" in capsys.readouterr().err


EXAMPLES = Path(__file__).resolve().parents[1] / "examples" / "backends"


@pytest.fixture
def acme_on_path(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(dynamic, "advertised_entry_points", lambda: [])
    monkeypatch.setenv(dynamic.BACKEND_PATHS_ENV, str(EXAMPLES))


def test_inspect_uses_the_dynamic_backends_on_the_backend_path(acme_on_path, capsys):
    assert main(["inspect", SQUEEZENET, "--backends", "Acme_Sample,CpuRef", "--layers"]) == 0
    out = capsys.readouterr().out
    assert "layers per backend: Acme_Sample=26, CpuRef=13" in out
    assert "Acme_Sample: Conv 'n0' + Relu 'n1' -> Conv 'n0' (+Relu)" in out
    assert (
        "  'n2', 'n17', 'n32' (3 x MaxPool) -> CpuRef: Acme_Sample: Acme_Sample has no kernel for MaxPool"
        in out
    )
    assert not flowrt.backend_registry().is_registered("Acme_Sample")  # the process registry is untouched


def test_run_and_backends_list_the_dynamic_backends(acme_on_path, capsys):
    assert main(["run", SQUEEZENET, "--backends", "Acme_Sample,CpuRef"]) == 0
    out = capsys.readouterr().out
    assert "Acme_Sample" in out and "match (max abs diff" in out
    assert main(["backends"]) == 0
    out = capsys.readouterr().out
    assert "Acme_Sample  version 1.0" in out
    assert f"    Acme_Sample 1.0  {EXAMPLES / 'Acme_Sample_backend.py'}" in out
