"""Backend assignment with recorded reasons, fallback, and the graph passes."""

import numpy as np
import pytest
from fakes import PartialBackend
from netbuild import branchy_expected, branchy_network

import flowrt
from flowrt.errors import UnsupportedLayerError
from flowrt.registry import BackendRegistry
from flowrt.types import TensorInfo
from flowrt.workers.cpu.ref import RefBackend


@pytest.fixture
def registry():
    registry = BackendRegistry()
    registry.register("CpuRef", RefBackend)
    registry.register("Partial", lambda: PartialBackend("Partial", {"Relu", "Add"}))
    registry.register(
        "Failing", lambda: PartialBackend("Failing", {"Relu", "Sigmoid", "Tanh", "Add"}, fail_subgraphs=True)
    )
    return registry


def test_first_backend_that_supports_a_layer_wins(registry):
    opt = flowrt.optimize(branchy_network(), backends=["Partial", "CpuRef"], registry=registry)
    assert opt.assignments() == {"relu": "Partial", "left": "CpuRef", "right": "CpuRef", "add": "Partial"}
    assert opt.decisions["left"].declined == {"Partial": "Partial only runs Add, Relu"}
    assert opt.backend_counts() == {"Partial": 2, "CpuRef": 2}


def test_fallback_is_shown_in_the_report(registry):
    report = flowrt.optimize(branchy_network(), backends=["Partial", "CpuRef"], registry=registry).report()
    assert "declined by Partial: Partial only runs Add, Relu" in report
    line = next(line for line in report.splitlines() if line.strip().startswith("left "))
    assert line.split()[-1] == "CpuRef"
    assert "Sigmoid" in line


def test_no_backend_raises_with_every_reason(registry):
    with pytest.raises(
        UnsupportedLayerError, match=r"layer 'left' \(Sigmoid\).*Partial: Partial only runs Add, Relu"
    ):
        flowrt.optimize(branchy_network(), backends=["Partial"], registry=registry)


def test_failed_subgraphs_go_to_the_next_backend(registry):
    opt = flowrt.optimize(branchy_network(), backends=["Failing", "CpuRef"], registry=registry)
    assert set(opt.assignments().values()) == {"CpuRef"}
    assert "optimize_subgraph" in opt.decisions["left"].declined["Failing"]
    assert any("re-assigned to CpuRef" in p for p in opt.passes)


async def test_mixed_backends_still_compute_the_same(registry):
    opt = flowrt.optimize(branchy_network(), backends=["Partial", "CpuRef"], registry=registry)
    x = np.linspace(-1, 1, 8, dtype=np.float32).reshape(2, 4)
    async with flowrt.Runtime(registry) as rt:
        out = await (await rt.load(opt)).run({"x": x})
    np.testing.assert_allclose(out["y"], branchy_expected(x), rtol=1e-6)


def test_dropout_and_identity_are_removed():
    net = flowrt.Network()
    x = net.add_input("x", TensorInfo((2, 3)))
    ident = net.add_layer("Identity", inputs=[x], name="ident")
    drop = net.add_layer("Dropout", inputs=[ident], name="drop")
    net.add_output("y", net.add_layer("Relu", inputs=[drop], name="relu"))
    opt = flowrt.optimize(net, backends=["CpuRef"])
    assert list(opt.assignments()) == ["relu"]
    assert "removed Identity 'ident'" in opt.passes
    assert "removed Dropout 'drop'" in opt.passes
    (y,) = flowrt.InferenceSession(opt).run(None, {"x": np.array([[-1, 0, 1]] * 2, np.float32)})
    np.testing.assert_array_equal(y, [[0, 0, 1]] * 2)


def test_a_cast_to_its_inputs_own_type_is_removed_and_other_casts_stay():
    net = flowrt.Network()
    x = net.add_input("x", TensorInfo((2, 3)))
    same = net.add_layer("Cast", flowrt.descriptors.Cast(to=1), [x], name="to_float")  # float32 already
    relu = net.add_layer("Relu", inputs=[same], name="relu")
    net.add_output("y", net.add_layer("Cast", flowrt.descriptors.Cast(to=7), [relu], name="to_int64"))
    opt = flowrt.optimize(net, backends=["CpuRef"])
    assert list(opt.assignments()) == ["relu", "to_int64"]
    assert "removed Cast 'to_float'" in opt.passes
    (y,) = flowrt.InferenceSession(opt).run(None, {"x": np.array([[-1.5, 0, 2.5]] * 2, np.float32)})
    assert y.dtype == np.int64
    np.testing.assert_array_equal(y, [[0, 0, 2]] * 2)


def test_constant_subgraphs_and_static_shapes_are_folded():
    net = flowrt.Network()
    x = net.add_input("x", TensorInfo((2, 3, 4)))
    shape = net.add_layer("Shape", inputs=[x], name="shape")
    flat = net.add_layer(
        "Reshape",
        inputs=[x, net.add_layer("Mul", inputs=[shape, np.array([1, 1, 1], np.int64)], name="mul")],
        name="reshape",
    )
    w = net.add_layer("Exp", inputs=[np.zeros((2, 3, 4), np.float32)], name="exp_of_const")
    net.add_output("y", net.add_layer("Add", inputs=[flat, w], name="add"))
    opt = flowrt.optimize(net, backends=["CpuRef"])
    assert list(opt.assignments()) == ["reshape", "add"]
    assert any("folded 3 constant layer(s)" in p for p in opt.passes)
    x_val = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    (y,) = flowrt.InferenceSession(opt).run(None, {"x": x_val})
    np.testing.assert_allclose(y, x_val + 1)


def test_a_fold_that_makes_a_shape_static_lets_its_shape_fold_in_the_same_round():
    # The pads are computed (an Add of constants), so the Pad's output shape is only known
    # once they are folded; the Shape of it folds as the round reaches it.
    net = flowrt.Network()
    x = net.add_input("x", TensorInfo((1, 2, 3, 3)))
    pads = net.add_layer("Add", inputs=[np.zeros(8, np.int64), np.array([0, 0, 1, 1, 0, 0, 1, 1], np.int64)])
    padded = net.add_layer("Pad", inputs=[x, pads], name="pad")
    shape = net.add_layer("Shape", inputs=[padded], name="shape")
    flat = net.add_layer("Reshape", inputs=[padded, shape], name="reshape")
    net.add_output("y", net.add_layer("Relu", inputs=[flat], name="relu"))
    opt = flowrt.optimize(net, backends=["CpuRef"])
    assert list(opt.assignments()) == ["pad", "reshape", "relu"]
    assert [p for p in opt.passes if "folded" in p] == ["folded 2 constant layer(s) (Add, Shape)"]
    x_val = np.arange(18, dtype=np.float32).reshape(1, 2, 3, 3) - 9
    (y,) = flowrt.InferenceSession(opt).run(None, {"x": x_val})
    np.testing.assert_array_equal(y, np.maximum(np.pad(x_val, ((0, 0), (0, 0), (1, 1), (1, 1))), 0))


def test_a_chain_of_pads_each_sized_by_the_shape_before_folds_whole():
    # Each Pad's pads come from the Shape of the previous Pad's output (as Swin's blocks pad
    # their windows): more links than rounds of folding, all static in the end.
    links = 12
    net = flowrt.Network()
    h = net.add_input("x", TensorInfo((1, 1, 2, 2)))
    for i in range(links):
        shape = net.add_layer("Shape", inputs=[h], name=f"shape{i}")
        side = net.add_layer("Gather", flowrt.descriptors.Gather(axis=0), [shape, np.array([3], np.int64)])
        odd = net.add_layer("Mod", inputs=[side, np.array([2], np.int64)])  # 1 when the side is odd
        pads = net.add_layer("Concat", flowrt.descriptors.Concat(axis=0), [np.zeros(7, np.int64), odd])
        h = net.add_layer("Pad", inputs=[h, pads], name=f"pad{i}")
        h = net.add_layer("Pad", inputs=[h, np.array([0, 0, 0, 0, 0, 0, 0, 1], np.int64)], name=f"grow{i}")
    net.add_output("y", h)
    opt = flowrt.optimize(net, backends=["CpuRef"])
    assert all(layer.outputs[0].info.is_static for layer in opt.graph if layer.kind == "Pad")
    assert not any(layer.kind in ("Shape", "Gather", "Mod", "Concat") for layer in opt.graph)
    (y,) = flowrt.InferenceSession(opt).run(None, {"x": np.ones((1, 1, 2, 2), np.float32)})
    width = 2
    for _ in range(links):
        width += width % 2 + 1  # made even, then one more
    assert y.shape == (1, 1, 2, width)


def _conv_bn_network(with_bias: bool):
    rng = np.random.default_rng(1)
    net = flowrt.Network()
    x = net.add_input("x", TensorInfo((1, 3, 8, 8)))
    weights = rng.standard_normal((4, 3, 3, 3)).astype(np.float32)
    bias = rng.standard_normal(4).astype(np.float32) if with_bias else None
    conv = net.add_layer("Conv", inputs=[x, weights, bias] if with_bias else [x, weights], name="conv")
    params = [rng.uniform(0.5, 2, 4), rng.standard_normal(4), rng.standard_normal(4), rng.uniform(0.5, 2, 4)]
    bn = net.add_layer(
        "BatchNormalization", inputs=[conv, *[p.astype(np.float32) for p in params]], name="bn"
    )
    net.add_output("y", net.add_layer("Relu", inputs=[bn], name="relu"))
    return net


def _with_and_without_batch_norm_folding(net: flowrt.Network):
    return flowrt.optimize(net, backends=["CpuRef"]), flowrt.optimize(
        net, options=flowrt.OptimizerOptions(fold_batch_norm=False), backends=["CpuRef"]
    )


def _same_outputs(folded, unfolded, x_shape, *, seed: int, rtol: float) -> None:
    """Both optimized networks give the same outputs for one random input ``x``."""
    x = np.random.default_rng(seed).standard_normal(x_shape).astype(np.float32)
    a = flowrt.InferenceSession(folded).run(None, {"x": x})
    b = flowrt.InferenceSession(unfolded).run(None, {"x": x})
    for got, expected in zip(a, b, strict=True):
        np.testing.assert_allclose(got, expected, rtol=rtol, atol=1e-5)


@pytest.mark.parametrize("with_bias", [True, False])
def test_batch_norm_folded_into_conv_keeps_results(with_bias):
    folded, unfolded = _with_and_without_batch_norm_folding(_conv_bn_network(with_bias))
    assert list(folded.assignments()) == ["conv", "relu"]
    assert "folded BatchNormalization 'bn' into Conv 'conv'" in folded.passes
    assert "bn" in unfolded.assignments()
    _same_outputs(folded, unfolded, (1, 3, 8, 8), seed=2, rtol=1e-4)


def _bn_bn_network(first_read_twice: bool) -> flowrt.Network:
    """x -> BatchNormalization -> per-channel Mul and Add -> Relu (Caffe2's SpatialBN as
    exported in the light densenet121), the first normalization also an output if asked."""
    rng = np.random.default_rng(3)
    net = flowrt.Network()
    x = net.add_input("x", TensorInfo((2, 4, 5, 5)))
    params = [rng.uniform(0.5, 2, 4), rng.standard_normal(4), rng.standard_normal(4), rng.uniform(0.5, 2, 4)]
    bn = net.add_layer("BatchNormalization", inputs=[x, *[p.astype(np.float32) for p in params]], name="bn")
    scale, shift = (rng.standard_normal((1, 4, 1, 1)).astype(np.float32) for _ in range(2))
    mul = net.add_layer("Mul", inputs=[bn, scale], name="mul")
    add = net.add_layer("Add", inputs=[mul, shift], name="add")
    net.add_output("y", net.add_layer("Relu", inputs=[add], name="relu"))
    if first_read_twice:
        net.add_output("z", bn)
    return net


@pytest.mark.parametrize("first_read_twice", [False, True])
def test_batch_norm_after_batch_norm_becomes_one(first_read_twice):
    folded, unfolded = _with_and_without_batch_norm_folding(_bn_bn_network(first_read_twice))
    norms = [name for name in folded.assignments() if folded.graph.layers[name].kind == "BatchNormalization"]
    if first_read_twice:
        # the first one's output is read as it is: folding the second into it would change it
        assert len(norms) == 2
    else:
        assert norms == ["bn"]
        assert "folded BatchNormalization 'mul/scale_shift' into BatchNormalization 'bn'" in folded.passes
    _same_outputs(folded, unfolded, (2, 4, 5, 5), seed=4, rtol=1e-5)


def test_optimize_leaves_the_network_unchanged():
    net = _conv_bn_network(True)
    before = sorted(net.graph.layers)
    flowrt.optimize(net, backends=["CpuRef"])
    assert sorted(net.graph.layers) == before
