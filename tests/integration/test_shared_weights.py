"""Transformed weights shared across loads, through the public API: a second load of the same
optimized network, another batch size and another runtime take the forms the first load made
(``memory_report``'s ``weights_bytes`` and ``shared_weights_bytes``), and compute the same."""

import gc

import numpy as np

import flowrt
from flowrt.engine.memory.weights import MANAGER
from flowrt.types import TensorInfo


def _filters(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    return (rng.standard_normal(shape) / np.sqrt(np.prod(shape[1:]))).astype(np.float32)


def _close(actual: np.ndarray, expected: np.ndarray) -> None:
    np.testing.assert_allclose(actual, expected, rtol=1e-4, atol=1e-5 * np.abs(expected).max())


def _convs() -> flowrt.Network:
    """Two 3x3 convs of 32 channels and a 1x1 one: CpuAcc packs or transforms each filter."""
    rng = np.random.default_rng(0)
    d = flowrt.descriptors
    net = flowrt.Network()
    x = net.add_input("x", TensorInfo((1, 16, 20, 20)))
    c1 = net.add_layer("Conv", d.Conv(pads=(1, 1, 1, 1)), [x, _filters(rng, (32, 16, 3, 3))], name="c1")
    r1 = net.add_layer("Relu", inputs=[c1], name="r1")
    c2 = net.add_layer("Conv", d.Conv(pads=(1, 1, 1, 1)), [r1, _filters(rng, (32, 32, 3, 3))], name="c2")
    c3 = net.add_layer("Conv", None, [c2, _filters(rng, (8, 32, 1, 1))], name="c3")
    net.add_output("y", c3)
    return net


def _input(batch: int = 1) -> np.ndarray:
    return np.random.default_rng(1).standard_normal((batch, 16, 20, 20)).astype(np.float32)


def _weights(model: flowrt.LoadedNetwork) -> tuple[int, int]:
    report = model.memory_report()["CpuAcc"]
    return report["weights_bytes"], report["shared_weights_bytes"]


async def test_a_second_load_takes_the_first_loads_transformed_weights():
    opt = flowrt.optimize(_convs(), backends=["CpuAcc"])
    reference = flowrt.optimize(_convs(), backends=["CpuRef"])
    async with flowrt.Runtime() as rt:
        first = await rt.load(opt)
        own, shared = _weights(first)
        assert own > 0 and shared == 0
        second = await rt.load(opt)
        assert _weights(second) == (0, own)
        expected = (await (await rt.load(reference)).run({"x": _input()}))["y"]
        for model in (first, second):
            _close((await model.run({"x": _input()}))["y"], expected)


async def test_another_runtime_and_another_batch_size_share_them_too():
    opt = flowrt.optimize(_convs(), backends=["CpuAcc"])
    async with flowrt.Runtime() as rt, flowrt.Runtime() as other:
        first = await rt.load(opt)
        own, _ = _weights(first)
        elsewhere = await other.load(opt)
        assert _weights(elsewhere) == (0, own)
        batched = await rt.load(opt, batch=4)
        made, taken = _weights(batched)
        assert taken > 0  # the forms both batch sizes read are held once
        one = (await first.run({"x": _input()}))["y"]
        four = (await batched.run({"x": np.repeat(_input(), 4, axis=0)}))["y"]
        for sample in four:
            _close(sample, one[0])
        assert taken <= own  # what it found made, the first load made


def _deep_conv() -> flowrt.Network:
    """A 3x3 conv of 32 -> 256 channels at 7x7: by the few-pixel tiles at batch 1, by Winograd
    at batch 4 when loaded alone."""
    net = flowrt.Network()
    x = net.add_input("x", TensorInfo((1, 32, 7, 7)))
    filters = _filters(np.random.default_rng(3), (256, 32, 3, 3))
    conv = net.add_layer("Conv", flowrt.descriptors.Conv(pads=(1, 1, 1, 1)), [x, filters], name="conv")
    net.add_output("y", conv)
    return net


async def test_a_batch_size_loaded_later_reads_the_forms_made_before_where_it_can():
    opt = flowrt.optimize(_deep_conv(), backends=["CpuAcc"])
    x = np.random.default_rng(4).standard_normal((4, 32, 7, 7)).astype(np.float32)
    async with flowrt.Runtime() as rt:
        alone = await rt.load(opt, batch=4)  # first of its constant: makes Winograd's panels
        winograd, _ = _weights(alone)
        expected = (await alone.run({"x": x}))["y"]
        await rt.unload(alone)
        del alone
        gc.collect()
        one = await rt.load(opt)
        made, _ = _weights(one)
        four = await rt.load(opt, batch=4)
        assert winograd > made > 0  # Winograd's panels are 16/9 of the filters
        assert _weights(four) == (0, made)
        _close((await four.run({"x": x}))["y"], expected)


def _strided_conv() -> flowrt.Network:
    """A 3x3 stride-2 conv of 128 -> 256 channels at 28x28: by the column tiles at batch 1, by
    one GEMM over the batch's pixels at batch 4 when loaded alone."""
    net = flowrt.Network()
    x = net.add_input("x", TensorInfo((1, 128, 28, 28)))
    filters = _filters(np.random.default_rng(5), (256, 128, 3, 3))
    conv = flowrt.descriptors.Conv(strides=(2, 2), pads=(1, 1, 1, 1))
    net.add_output("y", net.add_layer("Conv", conv, [x, filters], name="conv"))
    return net


async def test_a_batch_size_loaded_beside_batch_1_runs_by_the_forms_batch_1_made():
    opt = flowrt.optimize(_strided_conv(), backends=["CpuAcc"])
    reference = flowrt.optimize(_strided_conv(), backends=["CpuRef"])
    x = np.random.default_rng(6).standard_normal((4, 128, 28, 28)).astype(np.float32)
    async with flowrt.Runtime() as rt:
        expected = (await (await rt.load(reference, batch=4)).run({"x": x}))["y"]
        one = await rt.load(opt)
        made, _ = _weights(one)
        four = await rt.load(opt, batch=4)
        assert made > 0
        assert _weights(four) == (0, made)
        _close((await four.run({"x": x}))["y"], expected)


async def test_the_forms_are_freed_with_their_last_user():
    gc.collect()
    before = MANAGER.held_bytes()
    opt = flowrt.optimize(_convs(), backends=["CpuAcc"])
    async with flowrt.Runtime() as rt:
        model = await rt.load(opt)
        own, _ = _weights(model)
        assert MANAGER.held_bytes() - before >= own
        await rt.unload(model)
    del model
    gc.collect()
    assert MANAGER.held_bytes() == before


def _dense(rows: int) -> flowrt.Network:
    """A MatMul by constant weights, then a Gemm with transB and a bias."""
    rng = np.random.default_rng(2)
    net = flowrt.Network()
    x = net.add_input("x", TensorInfo((rows, 64)))
    mm = net.add_layer("MatMul", None, [x, _filters(rng, (64, 96))], name="mm")
    gemm = net.add_layer(
        "Gemm",
        flowrt.descriptors.Gemm(transB=1),
        [mm, _filters(rng, (48, 96)), _filters(rng, (48,))],
        name="gemm",
    )
    net.add_output("y", gemm)
    return net


async def test_matmul_and_gemm_weights_are_shared_by_panels_and_by_rows():
    for rows in (64, 1):  # register-tile panels for many rows, transposed rows for one
        opt = flowrt.optimize(_dense(rows), backends=["CpuAcc"])
        x = np.random.default_rng(3).standard_normal((rows, 64)).astype(np.float32)
        async with flowrt.Runtime() as rt:
            expected = (
                await (await rt.load(flowrt.optimize(_dense(rows), backends=["CpuRef"]))).run({"x": x})
            )["y"]
            first = await rt.load(opt)
            own, _ = _weights(first)
            assert own > 0
            second = await rt.load(opt)
            assert _weights(second) == (0, own)
            for model in (first, second):
                _close((await model.run({"x": x}))["y"], expected)
