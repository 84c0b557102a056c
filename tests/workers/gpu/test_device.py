"""Device choice, the program binary cache, and GpuAcc without OpenCL."""

import logging
import subprocess
import sys
import threading

import pytest
import trio

import flowrt
from flowrt.errors import BackendError
from flowrt.models import light_model
from flowrt.workers.gpu import GpuAccBackend, device
from flowrt.workers.gpu.program import ProgramCache


def test_device_chosen_by_index_pair_name_or_environment(gpu, monkeypatch):
    assert device.choose_device("0:0").int_ptr == device._devices()[0][2].int_ptr
    name = gpu.device.name
    assert device.choose_device(name[: max(3, len(name) // 2)].upper()).name == name
    monkeypatch.setenv(device.DEVICE_ENV, "0:0")
    assert device.choose_device().int_ptr == device._devices()[0][2].int_ptr
    with pytest.raises(BackendError, match=r"OpenCL device 'no such device' not found .*devices: 0:0"):
        device.choose_device("no such device")


def test_devices_are_described_with_memory_and_priority_hints(gpu):
    (first, *_) = device.describe_devices()
    assert first.index == "0:0" and first.global_memory_bytes > 0
    assert first.name and first.platform and isinstance(first.priority_hints, bool)
    assert [d.chosen for d in device.describe_devices()].count(True) == 1


def test_program_binaries_are_cached_on_disk(gpu, tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("FLOWRT_CACHE_DIR", str(tmp_path))
    cold = ProgramCache(gpu.context, gpu.device, store_binaries=True)
    cold.get("layout")
    assert cold.builds == {"layout": "source"}
    (binary,) = (tmp_path / "opencl").glob("layout--*.bin")
    warm = ProgramCache(gpu.context, gpu.device, store_binaries=True)
    assert (
        warm.get("layout").get_info(flowrt.workers.gpu.device.cl.program_info.NUM_KERNELS) == 6
    )  # transpose, transpose_runs, concat_slab, concat_many, split_many, gather_rows
    assert warm.builds == {"layout": "binary"}
    binary.write_bytes(b"not a program")
    with caplog.at_level(logging.INFO, logger="flowrt.workers.gpu.program"):
        ProgramCache(gpu.context, gpu.device, store_binaries=True).get("layout")
    assert "unusable, rebuilding from source" in caplog.text


def test_a_program_built_with_defines_is_a_program_of_its_own(gpu, tmp_path, monkeypatch):
    monkeypatch.setenv("FLOWRT_CACHE_DIR", str(tmp_path))
    cold = ProgramCache(gpu.context, gpu.device, store_binaries=True)
    assert cold.get("pad") is not cold.get("pad", "-DUNUSED=1")
    assert cold.builds == {"pad": "source", "pad -DUNUSED=1": "source"}
    assert len(list((tmp_path / "opencl").glob("pad--*.bin"))) == 2
    warm = ProgramCache(gpu.context, gpu.device, store_binaries=True)
    warm.get("pad", "-DUNUSED=1")
    assert warm.builds == {"pad -DUNUSED=1": "binary"}
    before = warm.get("pad", "-DUNUSED=1")
    monkeypatch.setenv("FLOWRT_OPENCL_BUILD_OPTIONS", "-DUNUSED=2")  # a program of its own again
    assert warm.get("pad", "-DUNUSED=1") is not before
    assert warm.builds["pad -DUNUSED=1 -DUNUSED=2"] == "source"
    monkeypatch.delenv("FLOWRT_OPENCL_BUILD_OPTIONS")
    # one work-item per column of B (16 x 1 of them) cannot load 24 columns: gemm.cl's #error
    with pytest.raises(BackendError, match=r"gemm\.cl \(.*-DTM=32 -DTN=24"):
        warm.get("gemm", "-DTM=32 -DTN=24 -DWPTM=2 -DWPTN=16")


def _registry():
    registry = flowrt.backend_registry().copy()
    if not registry.is_registered("GpuAcc"):
        registry.register("GpuAcc", GpuAccBackend)
    return registry


def test_without_an_opencl_platform_gpuacc_declines_and_naming_it_is_an_error(monkeypatch):
    monkeypatch.setattr(device, "platforms", lambda: [])
    answer = GpuAccBackend().layer_support().is_layer_supported("Relu", None, [], [])
    assert answer.reason == "GpuAcc is unavailable: no OpenCL platform or device found"
    net = flowrt.onnx.load(light_model("squeezenet"))
    with pytest.raises(
        BackendError,
        match=r"GpuAcc needs an OpenCL GPU device, and this machine has no OpenCL device "
        r"\(no OpenCL platform or device found\)",
    ):
        flowrt.optimize(net, backends=["GpuAcc", "CpuRef"], registry=_registry())
    with pytest.raises(BackendError, match="no OpenCL platform or device found"):
        device.choose_device()


class _CompilesNothing:
    """A listed device whose compiler builds no kernel (PoCL 3.0 on a CPU its LLVM does not
    know: AMD Zen 5 reads as 'generic')."""

    int_ptr = -17
    name = "pthread-AMD EPYC "
    platform = type("Platform", (), {"name": "Portable Computing Language"})


def test_a_device_that_builds_no_kernel_leaves_gpuacc_unavailable_saying_why(monkeypatch):
    if device.cl is None:
        pytest.skip(device.unavailable_reason())
    failure = "error: unknown target CPU 'generic'"
    monkeypatch.setattr(device, "_devices", lambda: [(0, 0, _CompilesNothing())])
    monkeypatch.setitem(device._build_failures, _CompilesNothing.int_ptr, failure)
    reason = f"no OpenCL device here can build kernels (0:0 'pthread-AMD EPYC': {failure})"
    assert device.unavailable_reason() == reason
    answer = GpuAccBackend().layer_support().is_layer_supported("Relu", None, [], [])
    assert (answer.supported, answer.reason) == (False, f"GpuAcc is unavailable: {reason}")
    with pytest.raises(
        BackendError,
        match=r"'pthread-AMD EPYC' \(Portable Computing Language\) cannot build kernels: error: unknown target CPU 'generic'; GpuAcc cannot run on it",
    ):
        device.choose_device("0:0")


def test_the_build_probe_of_a_listed_device_says_whether_it_compiles(gpu):
    # gpu: a device whose compiler builds kernels (the tests skip where there is none)
    assert device.build_failure(gpu.device) == ""
    assert any(d.build_failure == "" for d in device.describe_devices())


def test_flowrt_imports_and_gpuacc_declines_when_pyopencl_cannot_load():
    script = (
        "import sys; sys.modules['pyopencl'] = None\n"
        "import flowrt\n"
        "from flowrt.workers.gpu import GpuAccBackend\n"
        "answer = GpuAccBackend().layer_support().is_layer_supported('Relu', None, [], [])\n"
        "print(answer.supported, answer.reason)\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    assert done.stdout.startswith("False GpuAcc is unavailable: pyopencl failed to import")


def test_import_flowrt_and_a_cpu_run_leave_pyopencl_unloaded_until_gpuacc_is_made():
    script = (
        "import sys, numpy as np, flowrt\n"
        "net = flowrt.Network()\n"
        "x = net.add_input('x', flowrt.TensorInfo((2, 3), flowrt.DataType.FLOAT32))\n"
        "net.add_output('y', net.add_layer('Relu', inputs=[x]))\n"
        "with flowrt.InferenceSession(flowrt.optimize(net, backends=['CpuRef'])) as s:\n"
        "    y = s.run(None, {'x': np.full((2, 3), -1.0, np.float32)})[0]\n"
        "print(float(y.sum()), 'pyopencl' in sys.modules)\n"
        "flowrt.backend_registry().get('GpuAcc')\n"
        "print('pyopencl' in sys.modules)\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    assert done.stdout.split() == ["0.0", "False", "True"]


def test_flowrt_backends_lists_opencl_devices_with_memory_and_priority_hints(gpu, capsys):
    from flowrt.cli import main

    assert main(["backends"]) == 0
    out = capsys.readouterr().out
    assert "GpuAcc  version 0.1  capabilities: host_memory=False" in out
    (line,) = [line for line in out.splitlines() if line.startswith(" * 0:0")]
    assert gpu.device.name.strip() in line and " GiB " in line
    assert f"queue priority hints: {'yes' if gpu.priority_hints else 'no'}" in line
    assert f"tensor cores: {'yes' if gpu.tensor_cores else 'no'}" in line


def test_tensor_cores_are_an_nvidia_gpu_of_compute_capability_8_or_later():
    class Fake:
        def __init__(self, kind, extensions, major):
            self.type, self.extensions, self.compute_capability_major_nv = kind, extensions, major

    gpu, cpu = device.cl.device_type.GPU, device.cl.device_type.CPU
    nv = "cl_khr_fp64 cl_nv_device_attribute_query"
    assert device.has_tensor_cores(Fake(gpu, nv, 9)) and device.has_tensor_cores(Fake(gpu, nv, 8))
    assert not device.has_tensor_cores(Fake(gpu, nv, 7))  # Volta's and Turing's mma shapes differ
    assert not device.has_tensor_cores(Fake(gpu, "cl_khr_fp64", 9))  # not NVIDIA's driver
    assert not device.has_tensor_cores(Fake(cpu, nv, 9))


def test_flowrt_backends_says_why_there_is_no_opencl_device(monkeypatch, capsys):
    from flowrt.cli import main

    monkeypatch.setattr(device, "platforms", lambda: [])
    assert main(["backends"]) == 0
    assert "OpenCL devices: none (no OpenCL platform or device found)" in capsys.readouterr().out


def test_program_binaries_are_written_for_a_gpu_only_by_default(gpu, tmp_path, monkeypatch):
    # PoCL's CPU device builds from source in milliseconds and caches its kernels itself
    monkeypatch.setenv("FLOWRT_CACHE_DIR", str(tmp_path))
    cache = ProgramCache(gpu.context, gpu.device)
    cache.get("pad")
    on_gpu = bool(gpu.device.type & flowrt.workers.gpu.device.cl.device_type.GPU)
    assert cache.store_binaries is on_gpu
    assert len(list((tmp_path / "opencl").glob("pad--*.bin"))) == int(on_gpu)


def test_programs_build_on_build_threads_while_kernels_are_made(gpu, tmp_path, monkeypatch):
    monkeypatch.setenv("FLOWRT_CACHE_DIR", str(tmp_path))
    cache = ProgramCache(gpu.context, gpu.device)
    release, events = threading.Event(), []
    build = cache._build

    def held(name, key, options):
        events.append(("build starts", threading.current_thread().name))
        release.wait(10)
        return build(name, key, options)

    monkeypatch.setattr(cache, "_build", held)
    with cache.collecting() as asked:
        keys = [cache.request("pad"), cache.request("pad", "-DUNUSED=3"), cache.request("pad")]
    events.append(("asked", keys))
    release.set()
    cache.wait(asked)
    assert asked == {"pad", "pad -DUNUSED=3"} and keys[0] == keys[2]
    assert events[-1] == ("asked", keys)  # nothing waited for a build
    assert sorted(name.split("_")[0] for _, name in events[:-1]) == ["flowrt-opencl-build"] * 2
    assert cache.builds == {"pad": "source", "pad -DUNUSED=3": "source"}


def test_a_program_that_fails_to_build_fails_the_load_and_builds_again_when_asked(gpu, monkeypatch):
    path = light_model("squeezenet")
    opt = flowrt.optimize(flowrt.onnx.load(path), backends=["GpuAcc", "CpuRef"])
    # every program's source then fails to compile; the option is part of each program's key
    monkeypatch.setenv("FLOWRT_OPENCL_BUILD_OPTIONS", "-Dfloat=no_such_type")

    async def load() -> None:
        async with flowrt.Runtime() as rt:
            await rt.load(opt)

    with pytest.raises(BackendError, match=r"GpuAcc failed to build \w+\.cl \(.*-Dfloat=no_such_type"):
        trio.run(load)
    key = gpu.programs.request("pad")
    with pytest.raises(BackendError, match=r"failed to build pad\.cl"):
        gpu.programs.get_key(key)
    monkeypatch.delenv("FLOWRT_OPENCL_BUILD_OPTIONS")
    trio.run(load)


def test_a_device_context_takes_the_context_its_build_probe_made(gpu, monkeypatch):
    from flowrt.workers.gpu.context import DeviceContext

    monkeypatch.setattr(device, "_build_failures", {})
    monkeypatch.setattr(device, "_probe_contexts", {})
    made = []
    real = device.cl.Context

    def counted(*args, **kwargs):
        made.append(real(*args, **kwargs))
        return made[-1]

    monkeypatch.setattr(device.cl, "Context", counted)
    assert device.build_failure(gpu.device) == ""
    first = DeviceContext(gpu.device)
    assert len(made) == 1 and first.context is made[0]
    assert DeviceContext(gpu.device).context is made[1]  # handed over once: a second makes its own
