"""``pool_before_conv``: an AveragePool after a 1x1 conv moves before it where that saves work,
and only where the two commute."""

import numpy as np
import pytest

import flowrt
from flowrt.descriptors import AveragePool, Conv
from flowrt.types import TensorInfo


def _transition(
    *,
    kernel: int = 1,
    conv_strides: tuple[int, int] = (1, 1),
    group: int = 1,
    relu_after_conv: bool = False,
    conv_read_twice: bool = False,
    pool: AveragePool | None = None,
    channels: tuple[int, int] = (8, 4),
) -> flowrt.Network:
    """x -> Relu -> Conv (with bias) [-> Relu] -> AveragePool -> y: DenseNet's transition."""
    rng = np.random.default_rng(5)
    c_in, c_out = channels
    net = flowrt.Network()
    x = net.add_input("x", TensorInfo((2, c_in, 8, 8)))
    relu = net.add_layer("Relu", inputs=[x], name="relu")
    weights = rng.standard_normal((c_out, c_in // group, kernel, kernel)).astype(np.float32)
    bias = rng.standard_normal(c_out).astype(np.float32)
    pads = (kernel // 2,) * 4
    conv = net.add_layer(
        "Conv", Conv(strides=conv_strides, pads=pads, group=group), [relu, weights, bias], name="conv"
    )
    before_pool = net.add_layer("Relu", inputs=[conv], name="relu2") if relu_after_conv else conv
    pooled = net.add_layer(
        "AveragePool", pool or AveragePool(kernel_shape=(2, 2), strides=(2, 2)), [before_pool], name="pool"
    )
    net.add_output("y", pooled)
    if conv_read_twice:
        net.add_output("z", conv)
    return net


def _outputs(net: flowrt.Network, backends: list[str], **options) -> list[np.ndarray]:
    x = np.random.default_rng(6).standard_normal(net.graph.layers["x"].descriptor.info.shape)
    opt = flowrt.optimize(net, backends=backends, options=flowrt.OptimizerOptions(**options))
    return flowrt.InferenceSession(opt).run(None, {"x": x.astype(np.float32)})


MOVED = "moved AveragePool 'pool' before Conv 'conv'"


@pytest.mark.parametrize("group", [1, 2])
@pytest.mark.parametrize("backends", [["CpuRef"], ["CpuAcc", "CpuRef"]])
def test_an_average_pool_moves_before_the_1x1_conv_it_reads(group, backends):
    net = _transition(group=group)
    opt = flowrt.optimize(net, backends=backends)
    assert any(change.startswith(MOVED) for change in opt.passes)
    pool, conv = opt.graph.layers["pool"], opt.graph.layers["conv"]
    assert pool.inputs[0].source.layer.name == "relu"  # the pool reads the conv's input
    assert conv.inputs[0].source.layer is pool
    assert pool.output_infos[0].shape == (2, 8, 4, 4) and conv.output_infos[0].shape == (2, 4, 4, 4)
    # the same outputs as the original order, up to the rounding of sums taken in another order
    (got,) = _outputs(net, backends)
    (expected,) = _outputs(net, ["CpuRef"], pool_before_conv=False)
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)
    assert "moved AveragePool" in flowrt.optimize(net, backends=backends).report()


@pytest.mark.parametrize(
    "case",
    [
        dict(kernel=3),  # a 3x3 conv mixes neighbouring pixels: it does not commute
        dict(conv_strides=(2, 2)),
        dict(relu_after_conv=True),  # not linear
        dict(conv_read_twice=True),  # the conv's full output is read as well
        dict(pool=AveragePool(kernel_shape=(2, 2), strides=(2, 2), pads=(1, 1, 1, 1), count_include_pad=1)),
        dict(pool=AveragePool(kernel_shape=(3, 3), strides=(2, 2), ceil_mode=1)),
        # a 3x3 stride-1 pool barely shrinks the plane: pooling 8 channels costs more than the
        # conv saves
        dict(pool=AveragePool(kernel_shape=(3, 3), strides=(1, 1))),
    ],
)
def test_the_pool_stays_after_the_conv_where_they_do_not_commute_or_nothing_is_saved(case):
    net = _transition(**case)
    opt = flowrt.optimize(net, backends=["CpuRef"])
    assert not any(change.startswith("moved AveragePool") for change in opt.passes)
    assert opt.graph.layers["pool"].inputs[0].source.layer.name in ("conv", "relu2")
    got, expected = _outputs(net, ["CpuRef"]), _outputs(net, ["CpuRef"], pool_before_conv=False)
    for a, b in zip(got, expected, strict=True):
        np.testing.assert_array_equal(a, b)


def test_densenet121s_transitions_pool_before_their_convs():
    from flowrt.models import light_model

    opt = flowrt.optimize(flowrt.onnx.load(light_model("densenet121")), backends=["CpuAcc", "CpuRef"])
    moved = [change for change in opt.passes if change.startswith("moved AveragePool")]
    assert len(moved) == 3  # one per transition
    assert not any(
        c.startswith("moved AveragePool")
        for c in flowrt.optimize(
            flowrt.onnx.load(light_model("densenet121")),
            options=flowrt.OptimizerOptions(pool_before_conv=False),
            backends=["CpuRef"],
        ).passes
    )
