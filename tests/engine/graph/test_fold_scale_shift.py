"""Per-channel Mul and Add by constants become one BatchNormalization (then fold into a Conv)."""

import numpy as np
import pytest

import flowrt
from flowrt.types import TensorInfo

rng = np.random.default_rng(7)
SCALE = rng.standard_normal((3, 1, 1)).astype(np.float32)
SHIFT = rng.standard_normal((1, 3, 1, 1)).astype(np.float32)


def _network(after_conv: bool, with_add: bool = True, scale=SCALE) -> flowrt.Network:
    net = flowrt.Network()
    x = net.add_input("x", TensorInfo((2, 3, 5, 5)))
    source = x
    if after_conv:
        weights = rng.standard_normal((3, 3, 3, 3)).astype(np.float32)
        source = net.add_layer(
            "Conv", flowrt.descriptors.Conv(pads=(1, 1, 1, 1)), inputs=[x, weights], name="conv"
        )
    mul = net.add_layer("Mul", inputs=[source, scale], name="mul")
    last = net.add_layer("Add", inputs=[SHIFT, mul], name="add") if with_add else mul
    relu = net.add_layer("Relu", inputs=[last], name="relu")
    net.add_output("y", relu)
    return net


X = rng.standard_normal((2, 3, 5, 5)).astype(np.float32)


def _run(net, options=None, x=X):
    opt = flowrt.optimize(net, backends=["CpuRef"], options=options)
    (y,) = flowrt.InferenceSession(opt).run(None, {"x": x})
    return opt, y, x


@pytest.mark.parametrize("with_add", [True, False])
def test_mul_and_add_become_one_batch_normalization_with_the_same_result(with_add):
    net = _network(after_conv=False, with_add=with_add)
    opt, y, x = _run(net)
    kinds = sorted(layer.kind for layer in opt.graph if layer.backend)
    assert kinds == ["BatchNormalization", "Relu"]
    reference = np.maximum(x * SCALE + (SHIFT if with_add else 0), 0)
    np.testing.assert_array_equal(y, reference)
    assert any("into BatchNormalization" in p for p in opt.passes)


def test_after_a_conv_they_fold_into_its_weights():
    net = _network(after_conv=True)
    opt, y, x = _run(net)
    assert sorted(layer.kind for layer in opt.graph if layer.backend) == ["Conv", "Relu"]
    _, expected, _ = _run(net, flowrt.OptimizerOptions(fold_scale_shift=False, fold_batch_norm=False))
    np.testing.assert_allclose(y, expected, rtol=1e-5, atol=1e-5)


def test_non_per_channel_constants_are_left_alone():
    full = rng.standard_normal((2, 3, 5, 5)).astype(np.float32)
    opt, _, _ = _run(_network(after_conv=False, scale=full))
    assert "Mul" in {layer.kind for layer in opt.graph}
