"""Building networks in Python and validating them."""

import numpy as np
import pytest

import flowrt
from flowrt.engine.graph.subgraph import SubgraphView, connected_subgraphs
from flowrt.errors import GraphError, ShapeError
from flowrt.types import DataType, TensorInfo


def test_arm_nn_style_builder_runs_a_small_cnn():
    rng = np.random.default_rng(0)
    net = flowrt.Network()
    x = net.add_input("x", TensorInfo((1, 2, 5, 5)))
    conv_desc = flowrt.descriptors.Conv(pads=(1, 1, 1, 1))
    w = rng.standard_normal((3, 2, 3, 3)).astype(np.float32)
    b = rng.standard_normal(3).astype(np.float32)
    conv = net.add_convolution2d(conv_desc, w, b, name="conv1")
    x.output_slot(0).connect(conv.input_slot(0))
    relu = net.add_activation("Relu", name="relu1")
    conv.output_slot(0).connect(relu.input_slot(0))
    pool = net.add_pooling2d("GlobalAveragePool", None, name="gap")
    relu.output_slot(0).connect(pool.input_slot(0))
    net.add_output("y", pool)
    net.validate()
    assert pool.output_slot(0).info == TensorInfo((1, 3, 1, 1), DataType.FLOAT32)

    xv = rng.standard_normal((1, 2, 5, 5)).astype(np.float32)
    (y,) = flowrt.InferenceSession(net, backends=["CpuRef"]).run(None, {"x": xv})
    padded = np.pad(xv, ((0, 0), (0, 0), (1, 1), (1, 1)))
    ref = np.zeros((1, 3, 5, 5))
    for i in range(5):
        for j in range(5):
            ref[0, :, i, j] = np.tensordot(w, padded[0, :, i : i + 3, j : j + 3], axes=3) + b
    np.testing.assert_allclose(y.reshape(3), np.maximum(ref, 0).mean(axis=(2, 3)).reshape(3), rtol=1e-5)


def test_shape_error_names_layer_and_both_shapes():
    net = flowrt.Network()
    a = net.add_input("a", TensorInfo((2, 3)))
    b = net.add_input("b", TensorInfo((4, 5)))
    net.add_output("y", net.add_layer("Add", inputs=[a, b], name="bad_add"))
    with pytest.raises(ShapeError, match=r"layer 'bad_add' \(Add\).*\(2, 3\).*\(4, 5\)"):
        net.validate()


def test_unconnected_input_is_reported():
    net = flowrt.Network()
    relu = net.add_activation("Relu", name="lonely")
    net.add_output("y", relu)
    with pytest.raises(GraphError, match=r"layer 'lonely' \(Relu\).*not connected"):
        net.validate()


def test_cycle_is_reported():
    net = flowrt.Network()
    x = net.add_input("x", TensorInfo((2,)))
    a = net.add_layer("Add", inputs=[x, None], name="a")
    b = net.add_layer("Relu", inputs=[a], name="b")
    b.output_slot(0).connect(a.input_slot(1))
    with pytest.raises(GraphError, match=r"cycle through layers a, b"):
        net.validate()


def test_slot_connected_twice_is_refused():
    net = flowrt.Network()
    x = net.add_input("x", TensorInfo((2,)))
    relu = net.add_layer("Relu", inputs=[x])
    with pytest.raises(GraphError, match="already connected"):
        x.output_slot(0).connect(relu.input_slot(0))


def test_unknown_kind_and_duplicate_names():
    net = flowrt.Network()
    with pytest.raises(GraphError, match="unknown layer kind 'Frob'"):
        net.add_layer("Frob")
    net.add_input("x", TensorInfo((1,)))
    with pytest.raises(GraphError, match="already has an input called 'x'"):
        net.add_input("x", TensorInfo((1,)))


def test_layer_names_are_made_unique():
    net = flowrt.Network()
    x = net.add_input("x", TensorInfo((1,)))
    first = net.add_layer("Relu", inputs=[x], name="act")
    second = net.add_layer("Relu", inputs=[first], name="act")
    assert (first.name, second.name) == ("act", "act_1")


def test_subgraph_view_borders_and_connected_groups():
    net = flowrt.Network()
    x = net.add_input("x", TensorInfo((2,)))
    a = net.add_layer("Relu", inputs=[x], name="a")
    b = net.add_layer("Neg", inputs=[a], name="b")
    c = net.add_layer("Exp", inputs=[b], name="c")
    net.add_output("y", c)
    view = SubgraphView(net.graph, [b, a])
    assert [layer.name for layer in view] == ["a", "b"]
    assert [repr(s) for s in view.input_slots] == ["a<0"]
    assert [repr(s) for s in view.output_slots] == ["b:0"]
    groups = connected_subgraphs(net.graph, [a, c])
    assert sorted(len(g) for g in groups) == [1, 1]


def test_descriptors_are_found_by_kind_name():
    conv = flowrt.descriptors.Conv(pads=(1, 1, 1, 1))
    assert conv.pads == (1, 1, 1, 1)
    assert conv.group == 1
    with pytest.raises(AttributeError, match="no descriptor for layer kind 'Frob'"):
        flowrt.descriptors.Frob  # noqa: B018


def test_fused_conv_takes_a_residual_of_its_output_shape_only():
    w = np.ones((3, 2, 3, 3), np.float32)
    for z_shape in [(1, 3, 3, 3), (1, 3, 5, 5)]:
        net = flowrt.Network()
        x = net.add_input("x", TensorInfo((1, 2, 5, 5)))
        z = net.add_input("z", TensorInfo(z_shape))
        net.add_output("y", net.add_layer("FusedConv", flowrt.descriptors.Conv(), [x, w, None, z], name="fc"))
        if z_shape == (1, 3, 3, 3):
            net.validate()
            continue
        expected = (
            r"FusedConv expects Z of its output's shape \(1, 3, 3, 3\) and type float32, got \(1, 3, 5, 5\)"
        )
        with pytest.raises(ShapeError, match=expected):
            net.validate()
