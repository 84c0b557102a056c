"""GpuAcc test fixtures: the device (tests that need one skip without it) and a runner that
checks a layer on GpuAcc against CpuRef.

GpuAcc takes a CPU OpenCL device only when it is named, so where OpenCL shows no GPU (CI runs
these tests on PoCL) every test here names the first device through FLOWRT_OPENCL_DEVICE,
unless the environment already names one."""

import functools
import os

import numpy as np
import pytest

import flowrt
from flowrt.defaults import gpu_device_present
from flowrt.registry import WorkloadInfo
from flowrt.types import TensorInfo
from flowrt.workers.cpu.ref.kernels import load_all as ref_kernels
from flowrt.workers.gpu.device import DEVICE_ENV, describe_devices, unavailable_reason


@functools.cache
def _device_to_name() -> str | None:
    """The device the tests name: None where one is named already, OpenCL shows a GPU (taken
    unnamed), or there is no device; else the first (PoCL's CPU device, on CI)."""
    if os.environ.get(DEVICE_ENV) or unavailable_reason() or gpu_device_present():
        return None
    return describe_devices()[0].index


@pytest.fixture(autouse=True, scope="module")
def opencl_device_named():
    """Every test here, and each module's fixtures (autouse ones come first in their scope),
    run GpuAcc on the test device, named as a user names a CPU device."""
    spec = _device_to_name()
    with pytest.MonkeyPatch.context() as patch:
        if spec is not None:
            patch.setenv(DEVICE_ENV, spec)
        yield


@pytest.fixture(scope="session")
def gpu():
    """The process's DeviceContext; programs built once per session through it."""
    reason = unavailable_reason()
    if reason:
        pytest.skip(f"GpuAcc tests need an OpenCL device: {reason}")
    from flowrt.workers.gpu.context import device_context

    return device_context(_device_to_name())


def _layer_runner(gpu, half: bool):
    """Runs one layer on GpuAcc and on CpuRef: see ``run_both`` and ``run_half``."""
    from flowrt.workers.gpu.layer_support import GpuLayerSupport
    from flowrt.workers.gpu.tensor import GpuTensor
    from flowrt.workers.gpu.workload_factory import GpuWorkloadFactory

    factory = GpuWorkloadFactory(None, gpu)
    support = GpuLayerSupport()

    def run(kind, desc, inputs, constant=(), activation=None):
        if half:
            inputs = [x.astype(np.float16) if x.dtype == np.float32 else x for x in inputs]
        widened = [x.astype(np.float32) if x.dtype == np.float16 else x for x in inputs]
        expected = ref_kernels()[kind](desc, *widened)
        expected = [np.asarray(e) for e in (expected if isinstance(expected, tuple) else (expected,))]
        in_infos = tuple(TensorInfo.of(x) for x in inputs)
        out_infos = tuple(TensorInfo.of(e.astype(np.float16) if half else e) for e in expected)
        answer = support.is_layer_supported(kind, desc, in_infos, out_infos)
        assert answer.supported, answer.reason
        constants = tuple(x if i in constant else None for i, x in enumerate(inputs))
        workload = factory.create_workload(
            WorkloadInfo("layer", kind, desc, in_infos, out_infos, constants, activation)
        )
        workload.prepare()
        got = workload.execute(inputs)
        assert all(isinstance(g, GpuTensor) for g in got)
        if half:
            assert all(g.dtype == np.float16 for g in got)  # stored as half
            return [g.get().astype(np.float32) for g in got], expected
        return [g.get() for g in got], expected

    return run


@pytest.fixture(scope="session")
def run_both(gpu):
    """``run_both(kind, desc, inputs, constant=(...), activation=None)`` -> (GpuAcc outputs as
    numpy, CpuRef outputs); asserts that GpuAcc's layer support takes the layer first.
    ``constant`` names the input slots that are model constants."""
    return _layer_runner(gpu, half=False)


@pytest.fixture(scope="session")
def run_half(gpu):
    """``run_both`` for a float16 layer (``reduce_fp32_to_fp16``): the float32 inputs rounded
    to half, GpuAcc's half outputs widened to float32, CpuRef's float32 outputs on the same
    rounded inputs."""
    return _layer_runner(gpu, half=True)


def _conv_network(channels: int = 8, size: int = 16) -> flowrt.Network:
    """A small static-shape CNN that GpuAcc runs whole: Conv+Relu, MaxPool, Conv, Concat of
    both branches, GlobalAveragePool, Flatten, Gemm, Softmax."""
    rng = np.random.default_rng(0)
    net = flowrt.Network()
    x = net.add_input("x", TensorInfo((1, 3, size, size)))
    w1 = rng.standard_normal((channels, 3, 3, 3)).astype(np.float32) * 0.3
    conv1 = net.add_layer("Conv", flowrt.descriptors.Conv(pads=(1, 1, 1, 1)), [x, w1], name="conv1")
    relu = net.add_layer("Relu", inputs=[conv1], name="relu1")
    pool = net.add_layer("MaxPool", flowrt.descriptors.MaxPool(kernel_shape=(2, 2), strides=(2, 2)), [relu])
    w2 = rng.standard_normal((channels, channels, 1, 1)).astype(np.float32) * 0.3
    conv2 = net.add_layer("Conv", flowrt.descriptors.Conv(), [pool, w2], name="conv2")
    both = net.add_layer("Concat", flowrt.descriptors.Concat(axis=1), [pool, conv2], name="concat")
    gap = net.add_layer("GlobalAveragePool", inputs=[both])
    flat = net.add_layer("Flatten", flowrt.descriptors.Flatten(axis=1), [gap])
    w3 = rng.standard_normal((2 * channels, 10)).astype(np.float32)
    gemm = net.add_layer("Gemm", flowrt.descriptors.Gemm(), [flat, w3], name="gemm")
    net.add_output("y", net.add_layer("Softmax", flowrt.descriptors.Softmax(axis=1), [gemm], name="softmax"))
    return net


@pytest.fixture(scope="session")
def conv_network():
    """Makes the small CNN of ``_conv_network`` (a new Network per call)."""
    return _conv_network


@pytest.fixture(scope="session")
def conv_net_reference():
    """``(feeds, expected outputs)`` of the ``conv_network`` CNN, from CpuRef."""
    import trio

    x = np.linspace(-1, 1, 3 * 16 * 16, dtype=np.float32).reshape(1, 3, 16, 16)

    async def run():
        async with flowrt.Runtime(cpu_workers=1) as rt:
            model = await rt.load(flowrt.optimize(_conv_network(), backends=["CpuRef"]))
            return await model.run({"x": x})

    return {"x": x}, trio.run(run)


def _matmul_chain(width: int = 512, layers: int = 4, rows: int = 128) -> flowrt.Network:
    rng = np.random.default_rng(0)
    net = flowrt.Network()
    h = net.add_input("x", TensorInfo((rows, width)))
    for _ in range(layers):
        w = (rng.standard_normal((width, width)) / np.sqrt(width)).astype(np.float32)
        h = net.add_layer("MatMul", inputs=[h, w])
    net.add_output("y", h)
    return net


@pytest.fixture(scope="session")
def matmul_chain():
    """Makes a chain of MatMul layers (x: (rows, width)) that takes PoCL a tenth of a second or
    more per run: work long enough to be caught in flight."""
    return _matmul_chain


@pytest.fixture
def force_gemm_plan(monkeypatch):
    """``force_gemm_plan(tiling, splits)``: every GEMM planned from then on takes the tiling of
    that name (among the tilings it plans from: the FMA builds', or the tensor cores') with K
    in ``splits`` slices; returns the list of those tilings dicts, one per GEMM planned."""
    from flowrt.workers.gpu.kernels import gemm as gemm_module

    planned = []

    def force(tiling: str, splits: int) -> list:
        def forced(shape, batches, units, cpu=False, tilings=gemm_module.TILINGS, whole_k=False):
            planned.append(tilings)
            parts = 1 if whole_k else splits
            k_split = -(-shape[2] // parts // gemm_module.TK) * gemm_module.TK
            return gemm_module.GemmPlan(tilings[tiling], parts, k_split)

        monkeypatch.setattr(gemm_module, "plan_gemm", forced)
        return planned

    return force
