"""GpuAcc's Transpose is a view (no launch, no bytes of its own) where only axes of size 1 move:
torchvision's attention turns (1, S, D) into (S, 1, D) and back at batch 1. A batch of more
moves the elements again, and a batching stream still gets each sample's own result."""

import numpy as np
from fusedruns import alone_and_batched, cpuref_output, steady_launches

import flowrt
from flowrt.engine.graph.layers.transpose import moves_data
from flowrt.types import TensorInfo

SEQ, WIDTH = 6, 8


def test_moves_data_only_where_axes_longer_than_one_change_order():
    assert not moves_data((1, 6, 8), (1, 0, 2))
    assert not moves_data((6, 1, 8), (1, 0, 2))
    assert not moves_data((1, 6, 1, 8), (2, 1, 3, 0))
    assert not moves_data((3, 4), (0, 1))
    assert moves_data((2, 6, 8), (1, 0, 2))
    assert moves_data((1, 6, 8), (0, 2, 1))
    assert moves_data((6, 1, 8), (2, 1, 0))


def _sequence_network(batch: int = 1) -> flowrt.Network:
    """x (batch, S, D) -> MatMul -> Transpose to (S, batch, D) -> Mul -> Transpose back -> MatMul:
    the Transposes move only the batch's axis, of size 1 at batch 1."""
    rng = np.random.default_rng(3)
    net = flowrt.Network()
    x = net.add_input("x", TensorInfo((batch, SEQ, WIDTH)))
    w1 = rng.standard_normal((WIDTH, WIDTH)).astype(np.float32)
    w2 = rng.standard_normal((WIDTH, WIDTH)).astype(np.float32)
    first = net.add_layer("MatMul", inputs=[x, w1], name="first")
    turned = net.add_layer("Transpose", flowrt.descriptors.Transpose(perm=(1, 0, 2)), [first], name="turn")
    scaled = net.add_layer("Mul", inputs=[turned, np.float32(0.5)], name="scale")
    back = net.add_layer("Transpose", flowrt.descriptors.Transpose(perm=(1, 0, 2)), [scaled], name="back")
    net.add_output("out", net.add_layer("MatMul", inputs=[back, w2], name="last"))
    return net


def test_transposes_of_the_batch_axis_at_batch_1_launch_nothing(gpu):
    feeds = {"x": np.random.default_rng(0).standard_normal((1, SEQ, WIDTH)).astype(np.float32)}
    opt = flowrt.optimize(_sequence_network(), backends=["GpuAcc", "CpuRef"])
    assert set(opt.assignments().values()) == {"GpuAcc"}
    launches, out = steady_launches(opt, feeds)
    assert launches["turn"] == launches["back"] == 0
    assert launches["first"] >= 1 and launches["scale"] >= 1 and launches["last"] >= 1
    np.testing.assert_allclose(out, cpuref_output(_sequence_network(), feeds), rtol=1e-5, atol=1e-5)


def test_at_batch_2_the_transposes_move_the_elements(gpu):
    feeds = {"x": np.random.default_rng(1).standard_normal((2, SEQ, WIDTH)).astype(np.float32)}
    opt = flowrt.optimize(_sequence_network(2), backends=["GpuAcc", "CpuRef"])
    launches, out = steady_launches(opt, feeds)
    assert launches["turn"] == launches["back"] == 1
    np.testing.assert_allclose(out, cpuref_output(_sequence_network(2), feeds), rtol=1e-5, atol=1e-5)


def test_a_batching_stream_gets_each_samples_own_result(gpu):
    """The batch-1 network re-batched for the stream: its Transposes move the batch's axis
    there, and each sample's result is still its lone run's."""
    rng = np.random.default_rng(2)
    feeds = [{"x": rng.standard_normal((1, SEQ, WIDTH)).astype(np.float32)} for _ in range(4)]
    opt = flowrt.optimize(_sequence_network(), backends=["GpuAcc", "CpuRef"])
    alone, batched, counts = alone_and_batched(opt, feeds)
    assert counts.get(4) == 1
    for feed, one, many in zip(feeds, alone, batched):
        np.testing.assert_allclose(one, cpuref_output(_sequence_network(), feed), rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(many, one, rtol=1e-5, atol=1e-6)
