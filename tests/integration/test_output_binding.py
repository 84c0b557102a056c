"""Outputs bound by the caller (``run(feeds, outputs={...})``): written by their producing layer
directly, with no copy, where they can be; copied into the caller's array where they cannot."""

import numpy as np
import pytest

import flowrt
from flowrt.types import TensorInfo


def _net(*, output_read_later: bool = False) -> flowrt.Network:
    """conv -> relu -> conv -> tanh (y); with ``output_read_later`` y also feeds a Sigmoid (z)."""
    rng = np.random.default_rng(0)
    net = flowrt.Network()
    x = net.add_input("x", TensorInfo((1, 3, 12, 12)))
    c1 = net.add_layer(
        "Conv",
        flowrt.descriptors.Conv(pads=(1, 1, 1, 1)),
        [x, rng.standard_normal((8, 3, 3, 3)).astype(np.float32), rng.standard_normal(8).astype(np.float32)],
        name="c1",
    )
    r1 = net.add_layer("Relu", inputs=[c1], name="r1")
    c2 = net.add_layer("Conv", None, [r1, rng.standard_normal((4, 8, 1, 1)).astype(np.float32)], name="c2")
    y = net.add_layer("Tanh", inputs=[c2], name="out")
    net.add_output("y", y)
    if output_read_later:
        net.add_output("z", net.add_layer("Sigmoid", inputs=[y], name="after"))
    return net


def _input(seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((1, 3, 12, 12)).astype(np.float32)


async def _reference(net: flowrt.Network, x: np.ndarray) -> dict[str, np.ndarray]:
    async with flowrt.Runtime() as rt:
        model = await rt.load(flowrt.optimize(net, backends=["CpuRef"]))
        return await model.run({"x": x})


def _planned_slot(model, name: str) -> np.ndarray:
    """The pool memory planned for output ``name`` in the model's only pool."""
    binding = model._bindings[model.dataflow.outputs[name]]
    return model.pools.pools[0].view(binding.backend, binding.offset, binding.shape, binding.dtype)


@pytest.mark.parametrize("profile", [False, True])
async def test_a_bound_output_is_written_by_its_producer_not_copied_from_the_pool(profile):
    x = _input(1)
    expected = (await _reference(_net(), x))["y"]
    async with flowrt.Runtime() as rt:
        model = await rt.load(flowrt.optimize(_net(), backends=["CpuAcc", "CpuRef"]), max_in_flight=1)
        await model.run({"x": x})  # the pool's program is made by a first, unbound run
        slot = _planned_slot(model, "y")
        slot.fill(np.nan)
        target = np.full((1, 4, 12, 12), -7.0, np.float32)
        result = await model.run({"x": x}, outputs={"y": target}, profile=profile)
        # Written into the caller's array; the pool's slot for it was never written.
        assert result["y"] is target
        np.testing.assert_allclose(target, expected, rtol=1e-4, atol=1e-5)
        assert np.isnan(slot).all()
        # An unbound run after it writes the pool again and returns a new array.
        again = (await model.run({"x": _input(2)}))["y"]
        assert not np.isnan(slot).any()
        assert not np.shares_memory(again, slot) and not np.shares_memory(again, target)
        np.testing.assert_allclose(again, (await _reference(_net(), _input(2)))["y"], rtol=1e-4, atol=1e-5)


async def test_successive_runs_write_each_their_own_bound_array():
    async with flowrt.Runtime() as rt:
        model = await rt.load(flowrt.optimize(_net(), backends=["CpuAcc", "CpuRef"]), max_in_flight=1)
        targets = [np.empty((1, 4, 12, 12), np.float32) for _ in range(3)]
        for seed, target in enumerate(targets):
            assert (await model.run({"x": _input(seed)}, outputs={"y": target}))["y"] is target
    for seed, target in enumerate(targets):
        expected = (await _reference(_net(), _input(seed)))["y"]
        np.testing.assert_allclose(target, expected, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("case", ["read by a later layer", "not contiguous", "shares memory with a feed"])
async def test_outputs_that_cannot_be_written_directly_are_copied_into_the_bound_array(case):
    read_later = case == "read by a later layer"
    net = _net(output_read_later=read_later)
    x = _input(3)
    expected = await _reference(net, x)
    async with flowrt.Runtime() as rt:
        model = await rt.load(flowrt.optimize(net, backends=["CpuAcc", "CpuRef"]), max_in_flight=1)
        feeds = {"x": x.copy()}
        if case == "not contiguous":
            target = np.empty((1, 4, 12, 24), np.float32)[..., ::2]
        elif case == "shares memory with a feed":
            big = np.zeros(2000, np.float32)
            big[: x.size] = x.reshape(-1)
            feeds = {"x": big[: x.size].reshape(x.shape)}
            target = big[x.size // 2 : x.size // 2 + 576].reshape(1, 4, 12, 12)
        else:
            target = np.empty((1, 4, 12, 12), np.float32)
        result = await model.run(feeds, outputs={"y": target})
        assert result["y"] is target
        np.testing.assert_allclose(target, expected["y"], rtol=1e-4, atol=1e-5)
        if read_later:
            np.testing.assert_allclose(result["z"], expected["z"], rtol=1e-4, atol=1e-5)
            assert not np.shares_memory(result["z"], target)


async def test_inference_session_io_binding_writes_bound_output_memory(tmp_path):
    onnx = pytest.importorskip("onnx")
    from onnx import TensorProto, helper

    w = np.random.default_rng(4).standard_normal((6, 5)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["m"]), helper.make_node("Relu", ["m"], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 6])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 5])],
        [onnx.numpy_helper.from_array(w, "w")],
    )
    path = tmp_path / "m.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    x = np.random.default_rng(5).standard_normal((2, 6)).astype(np.float32)
    out = np.empty((2, 5), np.float32)
    with flowrt.InferenceSession(path, backends=["CpuAcc", "CpuRef"]) as session:
        binding = session.io_binding()
        binding.bind_cpu_input("x", x)
        binding.bind_output("y", "cpu", 0, np.float32, out.shape, out.ctypes.data)
        session.run_with_iobinding(binding)
    np.testing.assert_allclose(out, np.maximum(x @ w, 0), rtol=1e-4, atol=1e-5)
    assert np.shares_memory(binding.get_outputs()[0].numpy(), out)


@pytest.mark.parametrize("large", [True, False])
async def test_a_large_unbound_output_is_written_into_an_array_of_its_own_each_run(large, monkeypatch):
    from flowrt.engine.scheduler import outputs

    # y is 2,304 bytes: "large" past a bound lowered below it, small under the default
    monkeypatch.setattr(outputs, "OWN_OUTPUT_BYTES", 1000 if large else outputs.OWN_OUTPUT_BYTES)
    async with flowrt.Runtime() as rt:
        model = await rt.load(flowrt.optimize(_net(), backends=["CpuAcc", "CpuRef"]), max_in_flight=1)
        await model.run({"x": _input(0)})
        slot = _planned_slot(model, "y")
        slot.fill(np.nan)
        results = [(await model.run({"x": _input(seed)}))["y"] for seed in (1, 2, 3)]
        # Large: the producer wrote each run's own array, the pool's slot never (no copy out).
        assert np.isnan(slot).all() == large
        for seed, y in zip((1, 2, 3), results):
            assert not np.shares_memory(y, slot)
            np.testing.assert_allclose(y, (await _reference(_net(), _input(seed)))["y"], rtol=1e-4, atol=1e-5)
        assert not np.shares_memory(results[0], results[1]) and not np.shares_memory(results[1], results[2])
