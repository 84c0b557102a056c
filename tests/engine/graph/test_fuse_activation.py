"""Activation fusion: an activation folds into its producer where the producer's backend says so."""

import numpy as np
import pytest
from fakes import PartialBackend

import flowrt
from flowrt import serialize
from flowrt.engine.graph.graph import workload_info
from flowrt.engine.graph.layer_kind import activation_kinds
from flowrt.registry import BackendRegistry, FusedActivation
from flowrt.types import TensorInfo


class FusingBackend(PartialBackend):
    capabilities = {"host_memory": True, "fused_activation": frozenset({"Add"})}


def _registry() -> BackendRegistry:
    registry = BackendRegistry()
    registry.register("Fuser", lambda: FusingBackend("Fuser", {"Add", "Relu", "Clip", "Tanh", "LeakyRelu"}))
    registry.register("Plain", lambda: PartialBackend("Plain", {"Relu"}))
    return registry


def _network(activation: str, *extra_inputs, read_twice: bool = False, **attributes) -> flowrt.Network:
    net = flowrt.Network()
    x = net.add_input("x", TensorInfo((2, 3)))
    add = net.add_layer("Add", inputs=[x, np.ones((2, 3), np.float32)], name="add")
    descriptor = getattr(flowrt.descriptors, activation)(**attributes)
    act = net.add_layer(activation, descriptor, inputs=[add, *extra_inputs], name="act")
    net.add_output("y", act)
    if read_twice:
        net.add_output("z", add)
    return net


def _layers(opt):
    return {layer.name: layer for layer in opt.graph}


@pytest.mark.parametrize(
    "activation, extra, attributes, expected",
    [
        ("Relu", (), {}, FusedActivation("Relu")),
        ("LeakyRelu", (), {"alpha": 0.25}, FusedActivation("LeakyRelu", 0.25)),
        (
            "Clip",
            (np.float32(-1), np.float32(6)),
            {},
            FusedActivation("Clip", -1.0, 6.0),
        ),
    ],
)
def test_activation_folds_into_its_producer(activation, extra, attributes, expected):
    opt = flowrt.optimize(
        _network(activation, *extra, **attributes), backends=["Fuser"], registry=_registry()
    )
    layers = _layers(opt)
    assert "act" not in layers
    assert layers["add"].activation == expected
    assert workload_info(layers["add"]).activation == expected
    assert f"fused {activation} 'act' into Add 'add' on Fuser" in opt.passes
    (output,) = [layer for layer in opt.graph if layer.kind == "Output"]
    assert output.inputs[0].source.layer.name == "add"


def test_no_fusion_when_the_producer_output_has_other_readers():
    opt = flowrt.optimize(_network("Relu", read_twice=True), backends=["Fuser"], registry=_registry())
    assert _layers(opt)["add"].activation is None and "act" in _layers(opt)


def test_no_fusion_across_backends_or_without_the_capability():
    opt = flowrt.optimize(_network("Relu"), backends=["Plain", "Fuser"], registry=_registry())
    layers = _layers(opt)
    assert (layers["add"].backend, layers["act"].backend) == ("Fuser", "Plain")
    assert layers["add"].activation is None
    opt = flowrt.optimize(_network("Tanh"), backends=["CpuRef"])
    assert "act" in _layers(opt)


def test_fusion_can_be_turned_off():
    options = flowrt.OptimizerOptions(fuse_activations=False)
    opt = flowrt.optimize(_network("Relu"), backends=["Fuser"], options=options, registry=_registry())
    assert "act" in _layers(opt)


def test_fused_activation_survives_save_and_load(tmp_path):
    registry = _registry()
    opt = flowrt.optimize(_network("LeakyRelu", alpha=0.5), backends=["Fuser"], registry=registry)
    serialize.save(opt, tmp_path / "m.flowrt")
    loaded = serialize.load(tmp_path / "m.flowrt", registry=registry)
    assert _layers(loaded)["add"].activation == FusedActivation("LeakyRelu", 0.5)


@pytest.mark.parametrize("activation", ["Sigmoid", "HardSigmoid", "Softplus"])
def test_engine_pass_fuses_only_the_activations_every_fusing_backend_applies(activation):
    registry = BackendRegistry()
    registry.register("Fuser", lambda: FusingBackend("Fuser", {"Add", activation}))
    opt = flowrt.optimize(_network(activation), backends=["Fuser"], registry=registry)
    fused = activation in activation_kinds("everywhere")
    assert ("act" not in _layers(opt)) is fused
    assert _layers(opt)["add"].activation == (FusedActivation(activation) if fused else None)


def test_matmul_with_symbolic_rows_and_a_bias_optimizes_on_cpuacc_unfused():
    # the bias's broadcast to (N, 8) cannot be checked: MatMul and Add stay two layers
    net = flowrt.Network()
    x = net.add_input("x", TensorInfo(("N", 4)))
    product = net.add_layer("MatMul", inputs=[x, np.ones((4, 8), np.float32)], name="mm")
    net.add_output("y", net.add_layer("Add", inputs=[product, np.ones(8, np.float32)], name="add"))
    opt = flowrt.optimize(net, backends=["CpuAcc", "CpuRef"])
    assert opt.assignments() == {"mm": "CpuAcc", "add": "CpuAcc"}
