"""The command line, through its entry point."""

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from flowrt.cli import main
from flowrt.defaults import default_backends
from flowrt.models import expected_outputs, light_model


def test_run_default_model_runs_on_the_fastest_backends_and_prints_top5_latency_and_check(capsys):
    # The one test of `flowrt run` with no arguments: the default model on the default backends.
    assert main(["run"]) == 0
    out = capsys.readouterr().out
    assert "light_shufflenet.onnx" in out
    assert f"layers per backend: {default_backends()[0]}=" in out
    assert "top-5 of gpu_0/softmax_1:" in out
    assert "latency over 1 run(s)" in out
    assert "output gpu_0/softmax_1 vs the model's shipped expected output: match" in out


def test_run_with_inputs_iterations_and_output_dir(tmp_path, capsys):
    path = light_model("squeezenet")
    x = (np.arange(3 * 224 * 224).reshape(1, 3, 224, 224) / (3 * 224 * 224)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    code = main(
        [
            "run",
            str(path),
            "--input",
            f"data_0={tmp_path / 'x.npy'}",
            "--output-dir",
            str(tmp_path / "out"),
            "--backends",
            "CpuRef",
            "--iterations",
            "3",
        ]
    )
    assert code == 0
    out = capsys.readouterr().out
    assert "latency over 3 run(s): min" in out
    assert "input data_0: float32(1, 3, 224, 224) (given)" in out
    written = np.load(tmp_path / "out" / "softmaxout_1.npy")
    np.testing.assert_allclose(written, expected_outputs(path)[0], rtol=1e-3, atol=1e-7)


def test_run_with_a_bad_input_name_is_a_clear_error(tmp_path, capsys):
    np.save(tmp_path / "x.npy", np.zeros(3, np.float32))
    assert main(["run", "--input", f"nope={tmp_path / 'x.npy'}", "--backends", "CpuRef"]) == 2
    err = capsys.readouterr().err
    assert "InputError" in err and "'nope'" in err and "data_0" in err


def test_run_with_a_missing_model_is_a_clear_error(tmp_path, capsys):
    assert main(["run", str(tmp_path / "missing.onnx")]) == 2
    assert "ModelLoadError" in capsys.readouterr().err


def test_inspect_lists_layers_types_shapes_and_backends(capsys):
    assert main(["inspect", str(light_model("squeezenet")), "--backends", "CpuRef", "--layers"]) == 0
    out = capsys.readouterr().out
    assert "layers per backend: CpuRef=" in out
    conv_lines = [line for line in out.splitlines() if " Conv " in line]
    assert conv_lines and all(line.rstrip().endswith("CpuRef") for line in conv_lines)
    assert "Softmax            float32(1, 1000, 1, 1)    CpuRef" in out


def test_backends_lists_cpuref_with_version_and_capabilities(capsys):
    assert main(["backends"]) == 0
    out = capsys.readouterr().out
    assert "CpuRef  version 1.0  capabilities:" in out


def test_backends_ops_prints_the_coverage_report_of_the_docs(capsys):
    # per layer kind, which backends have a kernel, then what each kernel declines: the page
    # docs/operators.md, read from the kernel registries
    assert main(["backends", "--ops"]) == 0
    out = capsys.readouterr().out
    assert "| Conv | ✓ | ✓ | ✓ |" in out and "| Acos | ✓ |   |   |" in out
    assert "## Limits" in out and "### CpuAcc" in out
    docs = Path(__file__).resolve().parent.parent / "docs" / "operators.md"
    assert out == docs.read_text(encoding="utf-8")


def test_console_script_is_installed():
    result = subprocess.run(
        [sys.executable, "-m", "flowrt.cli", "backends"], capture_output=True, text=True, check=True
    )
    assert "CpuRef" in result.stdout


@pytest.mark.parametrize("argv", [["run", "--iterations", "0"]])
def test_bad_arguments_are_errors_not_tracebacks(argv, capsys):
    assert main(argv) == 2
    assert "--iterations must be at least 1" in capsys.readouterr().err
