"""GpuAcc test fixtures: the device (tests that need one skip without it) and a runner that
checks a layer on GpuAcc against CpuRef."""

import numpy as np
import pytest

from flowrt.registry import WorkloadInfo
from flowrt.types import TensorInfo
from flowrt.workers.cpu.ref.kernels import load_all as ref_kernels
from flowrt.workers.gpu.device import unavailable_reason


@pytest.fixture(scope="session")
def gpu():
    """The process's DeviceContext; programs built once per session through it."""
    reason = unavailable_reason()
    if reason:
        pytest.skip(f"GpuAcc tests need an OpenCL device: {reason}")
    from flowrt.workers.gpu.context import device_context

    return device_context()


@pytest.fixture(scope="session")
def run_both(gpu):
    """``run_both(kind, desc, inputs, constant=(...), activation=None)`` -> (GpuAcc outputs as
    numpy, CpuRef outputs); asserts that GpuAcc's layer support takes the layer first.
    ``constant`` names the input slots that are model constants."""
    from flowrt.workers.gpu.layer_support import GpuLayerSupport
    from flowrt.workers.gpu.tensor import GpuTensor
    from flowrt.workers.gpu.workload_factory import GpuWorkloadFactory

    factory = GpuWorkloadFactory(None, gpu)
    support = GpuLayerSupport()

    def run(kind, desc, inputs, constant=(), activation=None):
        expected = ref_kernels()[kind](desc, *inputs)
        expected = [np.asarray(e) for e in (expected if isinstance(expected, tuple) else (expected,))]
        in_infos = tuple(TensorInfo.of(x) for x in inputs)
        out_infos = tuple(TensorInfo.of(e) for e in expected)
        answer = support.is_layer_supported(kind, desc, in_infos, out_infos)
        assert answer.supported, answer.reason
        constants = tuple(x if i in constant else None for i, x in enumerate(inputs))
        workload = factory.create_workload(
            WorkloadInfo("layer", kind, desc, in_infos, out_infos, constants, activation)
        )
        workload.prepare()
        got = workload.execute(inputs)
        assert all(isinstance(g, GpuTensor) for g in got)
        return [g.get() for g in got], expected

    return run
