"""Every path and option of the command line is checked before any model is opened or loaded:
a bad one is one line naming the option and the value, exit status 2, at once."""

import errno
import os
import subprocess
import sys

import numpy as np
import pytest

import flowrt
import flowrt.cli.run
from flowrt.cli import main


@pytest.fixture
def no_work(monkeypatch):
    """Fail the test if a command opens a model: its checks must have stopped it first."""

    def opened(*args, **kwargs):
        raise AssertionError("the model was opened before the options were checked")

    monkeypatch.setattr(flowrt.onnx, "load", opened)
    monkeypatch.setattr(flowrt, "optimize", opened)
    monkeypatch.setattr(flowrt.serialize, "load", opened)


@pytest.fixture
def files(tmp_path):
    """Bad input files, and a plain file to put paths under."""
    (tmp_path / "empty.npy").write_bytes(b"")
    (tmp_path / "text.npy").write_text("not numpy\n")
    np.savez(tmp_path / "two.npz", a=np.zeros(2), b=np.ones(2))
    np.save(tmp_path / "ok.npy", np.zeros((1, 4), np.float32))
    (tmp_path / "plain").write_text("a file")
    return tmp_path


CASES = [
    (["run", "{m}", "--input", "x=/dev/null"], "InputError: --input x=/dev/null: the file is empty"),
    (["run", "{m}", "--input", "x={t}/empty.npy"], "empty.npy: the file is empty, expected a .npy file"),
    (["run", "{m}", "--input", "x={t}/text.npy"], "text.npy: not a readable .npy file"),
    (["run", "{m}", "--input", "x={t}/two.npz"], "two.npz: an .npz archive, expected a .npy file"),
    (["run", "{m}", "--input", "x={t}/missing.npy"], "missing.npy: no such file"),
    (["run", "{m}", "--input", "x={t}/ok.npy", "--input", "x={t}/ok.npy"], "--input x is given twice"),
    (["run", "{m}", "--output-dir", "{t}/plain/out"], "cannot be made: {t}/plain is a file"),
    (["run", "{m}", "--output-dir", "{t}/plain"], "--output-dir {t}/plain exists and is not a directory"),
    (["run", "{m}", "--profile", "{t}/nowhere/t.json"], "directory {t}/nowhere does not exist"),
    (["run", "{m}", "--profile", "{t}"], "--profile {t} is a directory; expected a file"),
    # os.access says yes to root everywhere and to anyone under /proc: the checks write a file.
    (["run", "{m}", "--output-dir", "/proc/nope"], "--output-dir /proc/nope cannot be made in /proc: "),
    (["run", "{m}", "--output-dir", "/proc/self"], "--output-dir /proc/self is not writable: "),
    (["run", "{m}", "--profile", "/proc/x.json"], "--profile /proc/x.json: directory /proc is not writable"),
    (["bench", "{m}", "--plot", "/proc/p.png"], "--plot /proc/p.png: directory /proc is not writable"),
    (["tune", "{m}", "-o", "/proc/t.msgpack"], "--output /proc/t.msgpack: directory /proc is not writable"),
    (["convert", "{m}", "-o", "/proc/t.flowrt"], "--output /proc/t.flowrt: directory /proc is not writable"),
    (["run", "{m}", "--threads", "0"], "--threads must be from 1 to 1024, got 0"),
    (["run", "{m}", "--iterations", "0"], "--iterations must be at least 1, got 0"),
    (["bench", "{m}", "--threads", "2000"], "--threads must be from 1 to 1024, got 2000"),
    (["bench", "{m}", "--concurrency", "0"], "--iterations and --concurrency must be at least 1"),
    (["bench", "{m}", "--plot", "{t}/nowhere/p.png"], "--plot {t}/nowhere/p.png: directory"),
    (["tune", "{m}", "-o", "{t}/nowhere/t.msgpack"], "--output {t}/nowhere/t.msgpack: directory"),
    (["convert", "{m}", "-o", "{t}"], "--output {t} is a directory"),
    (["run", "{t}/missing.onnx"], "ModelLoadError: model {t}/missing.onnx: no such file"),
    (["inspect", "{t}"], "ModelLoadError: model {t} is a directory"),
    (["bench", "{t}/missing.onnx"], "ModelLoadError: model {t}/missing.onnx: no such file"),
    (["tune", "{t}/missing.onnx", "-o", "{t}/t.msgpack"], "ModelLoadError: model {t}/missing.onnx"),
    (["run", "{m}", "--backends", "Nope,CpuRef"], "--backends names 'Nope', which is not a registered"),
    (["inspect", "{m}", "--backends", " , "], "--backends expects a comma-separated list"),
]


@pytest.mark.parametrize("argv, message", CASES)
def test_bad_paths_and_options_fail_before_the_model_is_opened(
    argv, message, files, tiny_model, no_work, capsys
):
    fill = {"t": str(files), "m": tiny_model}
    assert main([arg.format(**fill) for arg in argv]) == 2
    err = capsys.readouterr().err
    assert message.format(**fill) in err
    assert err.count("\n") == 1 and err.startswith("flowrt: error: ")


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes anywhere")
def test_an_unwritable_output_dir_fails_before_the_run(tmp_path, tiny_model, no_work, capsys):
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    assert main(["run", tiny_model, "--output-dir", str(locked / "out")]) == 2
    assert f"cannot be made in {locked}: Permission denied" in capsys.readouterr().err


def test_a_missing_output_dir_is_made_by_the_check_and_left_empty(tmp_path, tiny_model, no_work):
    out = tmp_path / "a" / "b"
    assert main(["run", tiny_model, "--output-dir", str(out), "--input", "x=/dev/null"]) == 2
    assert out.is_dir() and not list(out.iterdir())  # the probe file is gone


@pytest.mark.parametrize("option", ["--output-dir", "--profile"])
def test_a_write_that_fails_after_the_run_is_one_line(option, tmp_path, tiny_model, monkeypatch, capsys):
    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(np, "save", full)
    monkeypatch.setattr(flowrt.cli.run, "write_chrome_trace", full)
    path = tmp_path / ("out" if option == "--output-dir" else "trace.json")
    assert main(["run", tiny_model, "--backends", "CpuRef", option, str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"flowrt: error: InputError: {option}: writing {path}")
    assert err.endswith("failed: No space left on device\n") and err.count("\n") == 1


def test_bench_vs_onnxruntime_without_it_says_how_to_install_it(tiny_model, no_work, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "onnxruntime", None)  # as if it were not installed
    assert main(["bench", tiny_model, "--vs", "onnxruntime"]) == 2
    err = capsys.readouterr().err
    assert "--vs onnxruntime needs the onnxruntime package, which is not installed" in err
    assert "pip install onnxruntime" in err and "ModuleNotFoundError" not in err


def test_bench_vs_onnxruntime_on_a_flowrt_file_asks_for_the_onnx(tiny_flowrt, no_work, capsys):
    assert main(["bench", tiny_flowrt, "--vs", "onnxruntime"]) == 2
    assert "--vs onnxruntime needs an .onnx model" in capsys.readouterr().err


def test_an_input_of_the_wrong_shape_fails_before_the_model_is_loaded(files, tiny_model, monkeypatch, capsys):
    np.save(files / "wide.npy", np.zeros((1, 5), np.float32))

    async def load(*args, **kwargs):
        raise AssertionError("the model was loaded before its inputs were checked")

    monkeypatch.setattr(flowrt.Runtime, "load", load)
    assert main(["run", tiny_model, "--backends", "CpuRef", "--input", f"x={files / 'wide.npy'}"]) == 2
    assert "ShapeError: --input x: input 'x' expects shape (1, 4), got (1, 5)" in capsys.readouterr().err


def test_the_console_script_exits_2_with_one_line_for_an_empty_input_file(tiny_model):
    result = subprocess.run(
        [sys.executable, "-m", "flowrt.cli", "run", tiny_model, "--input", "x=/dev/null"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert (
        result.stderr
        == "flowrt: error: InputError: --input x=/dev/null: the file is empty, expected a .npy file (numpy.save writes one)\n"
    )
