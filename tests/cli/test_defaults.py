"""The command line's backends: the fastest available by default, GpuAcc only where it can
really run, and .flowrt files taken wherever a model is, with the backends they were made for."""

import json

import pytest

from flowrt.cli import main
from flowrt.workers.gpu import device
from flowrt.workers.gpu.device import DeviceDescription


@pytest.fixture
def opencl(monkeypatch):
    """Set what OpenCL shows: ``opencl(gpu=..., reason=..., cpu_devices=[...])``."""
    monkeypatch.delenv(device.DEVICE_ENV, raising=False)

    def show(gpu: bool = False, reason: str = "", cpu_devices=()):
        monkeypatch.setattr(device, "gpu_device_present", lambda: gpu)
        monkeypatch.setattr(device, "unavailable_reason", lambda: reason)
        found = [
            DeviceDescription(f"0:{i}", name, "PoCL", "CPU", "3.0", 2**30, False)
            for i, name in enumerate(cpu_devices)
        ]
        monkeypatch.setattr(device, "describe_devices", lambda: found)
        monkeypatch.setattr(device, "_descriptions", lambda chosen: found)

    return show


def test_commands_default_to_cpuacc_then_cpuref_without_a_gpu(opencl, tiny_model, tmp_path, capsys):
    opencl(gpu=False, cpu_devices=["pthread-Fake"])
    assert main(["inspect", tiny_model]) == 0
    assert (
        "backends (preference order): CpuAcc, CpuRef\nlayers per backend: CpuAcc=1" in capsys.readouterr().out
    )
    assert main(["convert", tiny_model, "-o", str(tmp_path / "t.flowrt")]) == 0
    assert "3 layers (CpuAcc=1)" in capsys.readouterr().out


def test_commands_put_gpuacc_first_where_opencl_shows_a_gpu(opencl, tiny_model, capsys):
    opencl(gpu=True)
    assert main(["inspect", tiny_model]) == 0
    assert "backends (preference order): GpuAcc, CpuAcc, CpuRef" in capsys.readouterr().out


def test_asking_for_gpuacc_without_any_opencl_device_is_an_error(opencl, tiny_model, capsys):
    opencl(reason="no OpenCL platform or device found")
    assert main(["run", tiny_model, "--backends", "GpuAcc,CpuRef"]) == 2
    err = capsys.readouterr().err
    assert (
        "BackendError: --backends names GpuAcc: GpuAcc needs an OpenCL GPU device, and this machine has "
        "no OpenCL device (no OpenCL platform or device found)" in err
    )


def test_asking_for_gpuacc_with_only_a_cpu_opencl_device_is_an_error_naming_it(opencl, tiny_model, capsys):
    opencl(gpu=False, cpu_devices=["pthread-Fake"])
    assert main(["inspect", tiny_model, "--backends", "GpuAcc,CpuAcc,CpuRef"]) == 2
    err = capsys.readouterr().err
    assert (
        "--backends names GpuAcc: GpuAcc needs an OpenCL GPU device, and this machine has only a CPU "
        "OpenCL device: 0:0 'pthread-Fake' (PoCL), which runs most models slower than CpuAcc; to use it "
        f"anyway, name it: {device.DEVICE_ENV}=0:0" in err
    )


def test_flowrt_files_are_taken_by_run_bench_and_inspect(tiny_flowrt, capsys):
    assert main(["run", tiny_flowrt]) == 0
    assert "layers per backend: CpuRef=1" in capsys.readouterr().out
    assert main(["bench", tiny_flowrt, "--iterations", "2", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["backends"] == ["CpuRef"] and report["results"]["flowrt"]["requests"] == 2
    assert main(["inspect", tiny_flowrt, "--backends", "CpuRef"]) == 0  # the same list: no error
    assert "layers per backend: CpuRef=1" in capsys.readouterr().out


def test_backends_that_differ_from_a_flowrt_files_are_an_error_only_when_given(tiny_flowrt, capsys):
    assert main(["bench", tiny_flowrt, "--backends", "CpuAcc,CpuRef"]) == 2
    assert "--backends CpuAcc,CpuRef differs from the backends" in capsys.readouterr().err
    assert main(["tune", tiny_flowrt, "-o", tiny_flowrt + ".msgpack"]) == 2
    err = capsys.readouterr().err
    assert "no layer of" in err and "runs on GpuAcc" in err and "(it runs on CpuRef)" in err
    assert "--backends" not in err


def test_bench_with_a_hint_streams_the_requests_and_says_what_the_hint_chose(
    tiny_model, tmp_path, monkeypatch, capsys
):
    monkeypatch.setenv("FLOWRT_CACHE_DIR", str(tmp_path / "cache"))
    assert main(["bench", tiny_model, "--iterations", "6", "--hint", "throughput", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["hint"] == "throughput" and report["results"]["flowrt"]["requests"] == 6
    assert report["notes"]["flowrt"].startswith("hint throughput: per request with ")
    assert "-> batch " in report["notes"]["flowrt"]
    assert main(["bench", tiny_model, "--iterations", "4", "--hint", "latency"]) == 0
    out = capsys.readouterr().out
    assert "hint: latency" in out and "note: hint latency: unbatched, one request per pool" in out
    with pytest.raises(SystemExit) as exit_:
        main(["bench", tiny_model, "--hint", "fast"])
    assert exit_.value.code == 2 and "invalid choice: 'fast'" in capsys.readouterr().err


def test_inspect_prints_what_a_stream_hint_chooses(tiny_model, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("FLOWRT_CACHE_DIR", str(tmp_path / "cache"))
    assert main(["inspect", tiny_model, "--stream-hint", "latency"]) == 0
    out = capsys.readouterr().out
    assert "model.stream(hint='latency') chooses max_in_flight=" in out and ", unbatched" in out
    assert "because latency: unbatched, one request per pool" in out
    assert main(["inspect", tiny_model, "--stream-hint", "throughput"]) == 0
    out = capsys.readouterr().out
    assert "model.stream(hint='throughput') chooses" in out and "because throughput: per request with" in out
    assert len(list((tmp_path / "cache" / "hints").glob("*.json"))) == 1  # measured once, kept
