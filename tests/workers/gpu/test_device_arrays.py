"""Tensors that stay on the device between runs: ``model.device_array`` feeds read where they
are (no upload) and ``run(device_outputs=...)`` outputs copied within the device (no
download), matching CpuRef; the host still gets a copy of a feed its own layers read; bad
uses are clear errors."""

import numpy as np
import pytest
import trio

import flowrt
from flowrt.errors import ArgumentError, BackendError, InputError, ShapeError
from flowrt.types import TensorInfo
from flowrt.workers.gpu.backend_context import GpuBackendContext

W = np.random.default_rng(0).standard_normal((8, 4)).astype(np.float32)


def _network() -> flowrt.Network:
    """x -> MatMul -> Relu -> y, and x -> Sigmoid -> s (placed on CpuRef by a hint: a host
    layer reading the same feed)."""
    net = flowrt.Network()
    x = net.add_input("x", TensorInfo((1, 8)))
    product = net.add_layer("MatMul", inputs=[x, W], name="mm")
    net.add_output("y", net.add_layer("Relu", inputs=[product], name="relu"))
    net.add_output("s", net.add_layer("Sigmoid", inputs=[x], name="sig"))
    return net


def _optimized() -> flowrt.OptimizedNetwork:
    options = flowrt.OptimizerOptions(layer_backend_hints={"sig": "CpuRef"})
    opt = flowrt.optimize(_network(), backends=["GpuAcc", "CpuRef"], options=options)
    assert opt.assignments() == {"mm": "GpuAcc", "sig": "CpuRef"}  # the Relu fused into the MatMul
    return opt


def _expected(x: np.ndarray) -> dict[str, np.ndarray]:
    return {"y": np.maximum(x @ W, 0), "s": 1 / (1 + np.exp(-x))}


def _feed(seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((1, 8)).astype(np.float32)


@pytest.fixture
def transfers(monkeypatch):
    """Uploads, downloads and device copies the runs enqueue, by kind."""
    counts = {"upload": 0, "download": 0, "copy_out": 0}
    for kind in counts:
        original = getattr(GpuBackendContext, kind)

        def counted(self, *args, _original=original, _kind=kind):
            counts[_kind] += 1
            return _original(self, *args)

        monkeypatch.setattr(GpuBackendContext, kind, counted)
    return counts


def test_device_feeds_and_outputs_cross_no_bytes_to_or_from_the_host(gpu, transfers):
    async def main():
        async with flowrt.Runtime(cpu_workers=1) as rt:
            model = await rt.load(_optimized(), max_in_flight=1)
            feeds = [model.device_array(_feed(seed)) for seed in range(3)]
            assert isinstance(feeds[0], flowrt.DeviceArray)
            assert feeds[0].shape == (1, 8) and feeds[0].dtype == np.float32
            transfers.update(upload=0, download=0, copy_out=0)
            outs = [await model.run({"x": f}, device_outputs=["y"]) for f in feeds]
            return outs, dict(transfers)

    outs, counts = trio.run(main)
    assert counts == {"upload": 0, "download": 0, "copy_out": 3}
    for seed, out in enumerate(outs):
        assert isinstance(out["y"], flowrt.DeviceArray) and isinstance(out["s"], np.ndarray)
        want = _expected(_feed(seed))
        np.testing.assert_allclose(out["y"].numpy(), want["y"], rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(np.asarray(out["y"]), want["y"], rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(out["s"], want["s"], rtol=1e-6)


def test_a_device_output_is_the_callers_own_copy_and_feeds_may_mix(gpu):
    """The run's pool memory is reused by the next run; a DeviceArray it returned is not. A
    numpy feed goes up as before, and device_outputs=True keeps every output a device layer
    makes (the host layer's stays numpy)."""

    async def main():
        async with flowrt.Runtime(cpu_workers=1) as rt:
            model = await rt.load(_optimized(), max_in_flight=1)
            first = await model.run({"x": model.device_array(_feed(1))}, device_outputs=True)
            second = await model.run({"x": _feed(2)}, device_outputs=True)
            return first, second

    first, second = trio.run(main)
    np.testing.assert_allclose(first["y"].numpy(), _expected(_feed(1))["y"], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(second["y"].numpy(), _expected(_feed(2))["y"], rtol=1e-5, atol=1e-6)
    assert isinstance(second["s"], np.ndarray)


def test_bad_uses_are_clear_errors(gpu):
    async def main():
        async with flowrt.Runtime(cpu_workers=1) as rt:
            model = await rt.load(_optimized())
            feed = model.device_array(_feed(0))
            with pytest.raises(InputError, match="device_outputs names unknown output 'z'"):
                await model.run({"x": feed}, device_outputs=["z"])
            with pytest.raises(ArgumentError, match="device_outputs"):
                await model.run({"x": feed}, device_outputs="y")
            with pytest.raises(ArgumentError, match="not also bound to arrays"):
                await model.run(
                    {"x": feed}, outputs={"y": np.empty((1, 4), np.float32)}, device_outputs=["y"]
                )
            foreign = flowrt.DeviceArray(feed.tensor, owner=object())
            with pytest.raises(InputError, match="input 'x' is a DeviceArray of a device network"):
                await model.run({"x": foreign})
            with pytest.raises(ShapeError, match="input 'x' expects shape"):
                await model.run({"x": model.device_array(np.zeros((3, 8), np.float32))})
            async with model.stream(max_batch=4, max_delay=0.01) as stream:
                with pytest.raises(InputError, match="a batching stream joins"):
                    await stream.submit({"x": feed})
            host_only = await rt.load(flowrt.optimize(_network(), backends=["CpuRef"]))
            with pytest.raises(BackendError, match="runs no layer on a device"):
                host_only.device_array(_feed(0))
            with pytest.raises(BackendError, match="device_outputs, but network"):
                await host_only.run({"x": _feed(0)}, device_outputs=True)

    trio.run(main)


def _onnx_model() -> bytes:
    from onnx import TensorProto, helper, numpy_helper

    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["p"]), helper.make_node("Relu", ["p"], ["y"])],
        "mm",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])],
        [numpy_helper.from_array(W, "w")],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()


def test_onnxruntimes_iobinding_keeps_values_on_the_opencl_device(gpu, transfers):
    """As ONNX Runtime's users bind CUDA memory: an OrtValue made on the device, bound by its
    data_ptr (or as an OrtValue), an output bound to the device by name."""
    session = flowrt.InferenceSession(
        _onnx_model(), providers=["OpenCLExecutionProvider", "CPUExecutionProvider"]
    )
    try:
        x = flowrt.OrtValue.ortvalue_from_numpy(_feed(3), "opencl", 0)
        assert x.device_name() == "opencl" and x.shape() == [1, 8]
        np.testing.assert_array_equal(x.numpy(), _feed(3))
        binding = session.io_binding()
        binding.bind_input("x", x.device_name(), 0, np.float32, x.shape(), x.data_ptr())
        binding.bind_output("y", "opencl")
        session.run_with_iobinding(binding)  # the pool's first runs
        transfers.update(upload=0, download=0, copy_out=0)
        session.run_with_iobinding(binding)
        (y,) = binding.get_outputs()
        assert y.device_name() == "opencl"
        assert transfers == {"upload": 0, "download": 0, "copy_out": 1}
        np.testing.assert_allclose(
            binding.copy_outputs_to_cpu()[0], _expected(_feed(3))["y"], rtol=1e-5, atol=1e-6
        )
        x.update_inplace(_feed(4))  # written on the device, bound as an OrtValue now
        binding.bind_ortvalue_input("x", x)
        session.run_with_iobinding(binding)
        np.testing.assert_allclose(
            binding.get_outputs()[0].numpy(), _expected(_feed(4))["y"], rtol=1e-5, atol=1e-6
        )
        with pytest.raises(ArgumentError, match="buffer_ptr must be the data_ptr"):
            binding.bind_input("x", "opencl", 0, np.float32, [1, 8], x.data_ptr() + 4)
        with pytest.raises(ArgumentError, match="element_type and shape"):
            binding.bind_input("x", "opencl", 0, np.float32, [2, 4], x.data_ptr())
        with pytest.raises(ArgumentError, match="buffer_ptr must be None"):
            binding.bind_output("y", "opencl", 0, np.float32, [1, 4], 12345)
        with pytest.raises(ArgumentError, match="bind a device output by name"):
            binding.bind_ortvalue_output("y", x)
    finally:
        session.close()
