"""Transpose folding, reshape chains and float16 reduction: fewer layers, the same outputs."""

from typing import Any

import numpy as np
import pytest
import trio
from fakes import PartialBackend

import flowrt
from flowrt.registry import BackendRegistry
from flowrt.types import DataType, TensorInfo


def run(opt: flowrt.OptimizedNetwork, x: np.ndarray, registry: BackendRegistry | None = None) -> np.ndarray:
    async def main():
        async with flowrt.Runtime(registry, cpu_workers=1) as rt:
            return (await (await rt.load(opt, max_in_flight=1)).run({"x": x}))["y"]

    return trio.run(main)


def transposes(first: tuple[int, ...], second: tuple[int, ...]) -> flowrt.Network:
    d = flowrt.descriptors
    net = flowrt.Network()
    x = net.add_input("x", TensorInfo((2, 3, 4)))
    t1 = net.add_layer("Transpose", d.Transpose(perm=first), [x], name="t1")
    t2 = net.add_layer("Transpose", d.Transpose(perm=second), [t1], name="t2")
    net.add_output("y", net.add_layer("Relu", inputs=[t2], name="relu"))
    return net


X = np.random.default_rng(1).standard_normal((2, 3, 4)).astype(np.float32)


def test_transposes_that_cancel_are_removed():
    opt = flowrt.optimize(transposes((0, 2, 1), (0, 2, 1)), backends=["CpuRef"])
    assert [layer.kind for layer in opt.graph if layer.backend] == ["Relu"]
    assert "removed Transpose 't2' (identity permutation)" in opt.passes
    np.testing.assert_array_equal(run(opt, X), np.maximum(X, 0))


def test_two_transposes_become_one_of_the_composed_permutation():
    opt = flowrt.optimize(transposes((1, 0, 2), (0, 2, 1)), backends=["CpuRef"])
    (merged,) = [layer for layer in opt.graph if layer.kind == "Transpose"]
    assert merged.descriptor.perm == (1, 2, 0)
    np.testing.assert_array_equal(run(opt, X), np.maximum(X.transpose(1, 0, 2).transpose(0, 2, 1), 0))


def test_a_reshape_chain_becomes_one_reshape():
    d = flowrt.descriptors
    net = flowrt.Network()
    x = net.add_input("x", TensorInfo((2, 3, 4)))
    r1 = net.add_layer("Reshape", inputs=[x, np.array([6, 4], np.int64)], name="r1")
    r2 = net.add_layer("Reshape", inputs=[r1, np.array([3, 2, 4], np.int64)], name="r2")
    flat = net.add_layer("Flatten", d.Flatten(axis=2), [r2], name="flat")
    net.add_output("y", net.add_layer("Relu", inputs=[flat], name="relu"))
    opt = flowrt.optimize(net, backends=["CpuRef"])
    assert sorted(layer.kind for layer in opt.graph if layer.backend) == ["Relu", "Reshape"]
    assert opt.graph.layers["flat"].outputs[0].info.shape == (6, 4)
    np.testing.assert_array_equal(run(opt, X), np.maximum(X.reshape(6, 4), 0))


class HalfBackend(PartialBackend):
    """Runs Add, Relu and Cast in any float type, declaring fp16."""

    capabilities: dict[str, Any] = {"host_memory": True, "fp16": True}


def half_registry() -> BackendRegistry:
    registry = BackendRegistry()
    registry.register("Half", lambda: HalfBackend("Half", {"Add", "Relu", "Cast"}))
    registry.register("CpuRef", flowrt.RefBackend)
    return registry


def add_relu_softmax() -> flowrt.Network:
    net = flowrt.Network()
    x = net.add_input("x", TensorInfo((2, 3, 4)))
    bias = np.linspace(-1, 1, 4, dtype=np.float32)
    relu = net.add_layer("Relu", inputs=[net.add_layer("Add", inputs=[x, bias], name="add")], name="relu")
    net.add_output("y", net.add_layer("Softmax", flowrt.descriptors.Softmax(axis=-1), [relu], name="softmax"))
    return net


def test_reduce_fp32_to_fp16_runs_the_fp16_backend_in_half_with_casts_at_its_borders():
    registry = half_registry()
    options = flowrt.OptimizerOptions(reduce_fp32_to_fp16=True, fold_constants=False)
    opt = flowrt.optimize(add_relu_softmax(), backends=["Half", "CpuRef"], options=options, registry=registry)
    layers = opt.graph.layers
    assert layers["add"].outputs[0].info.dtype is DataType.FLOAT16
    assert layers["relu"].outputs[0].info.dtype is DataType.FLOAT16
    assert layers["softmax"].input_infos[0].dtype is DataType.FLOAT32
    assert sorted(layer.name for layer in opt.graph if layer.kind == "Cast") == ["relu/to_fp32", "x/to_fp16"]
    assert "reduced Add 'add' on Half to float16" in opt.passes
    ref = flowrt.optimize(add_relu_softmax(), backends=["CpuRef"], registry=registry)
    half = run(opt, X, registry)
    assert half.dtype == np.float32
    np.testing.assert_allclose(half, run(ref, X, registry), rtol=2e-3, atol=1e-3)


def test_reduce_fp32_to_fp16_without_an_fp16_backend_is_reported_and_changes_nothing():
    options = flowrt.OptimizerOptions(reduce_fp32_to_fp16=True)
    opt = flowrt.optimize(add_relu_softmax(), backends=["CpuRef"], options=options)
    assert not [layer for layer in opt.graph if layer.kind == "Cast"]
    assert any("no backend in ['CpuRef'] declares fp16" in p for p in opt.passes)


def test_reduce_fp32_to_fp16_must_be_a_bool():
    with pytest.raises(TypeError, match="reduce_fp32_to_fp16"):
        flowrt.OptimizerOptions(reduce_fp32_to_fp16="yes")
