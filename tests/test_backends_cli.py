"""``flowrt inspect`` on a mixed preference list: assignment, substitutions, fallbacks, copies."""

from flowrt.cli import main
from flowrt.models import light_model


def test_inspect_shows_substitutions_fallbacks_and_copies(capsys):
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
    ]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "backends (preference order): GpuAcc, CpuAcc, CpuRef" in out
    gpu = "GpuAcc" if "GpuAcc=" in out else "CpuAcc"  # without OpenCL, CpuAcc takes GpuAcc's layers
    assert f"{gpu}: Conv 'n0' + Relu 'n1' -> Conv 'n0' (+Relu)" in out
    assert "  'n2' (MaxPool) -> CpuAcc: placed by layer_backend_hints" in out
    assert "  'n65' (Softmax) -> CpuRef: placed by layer_backend_hints" in out
    if gpu == "GpuAcc":
        assert "copies (" in out
        assert "  n0:0: GpuAcc -> host (copy) for 'n2'" in out
        assert "  n2:0: CpuAcc -> GpuAcc (copy) for 'n3'" in out
    else:
        assert "declined by GpuAcc: GpuAcc is unavailable" in out
    layer_rows = [line.split() for line in out.splitlines() if line.startswith("  n2 ")]
    assert layer_rows == [["n2", "MaxPool", "float32(1,", "64,", "55,", "55)", "CpuAcc"]]


def test_inspect_with_a_malformed_hint_is_a_clear_error(capsys):
    assert main(["inspect", "--hint", "n2"]) == 2
    assert "--hint expects LAYER=BACKEND, got 'n2'" in capsys.readouterr().err
