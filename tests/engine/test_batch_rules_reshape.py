"""Re-batching through Reshapes that fold each sample's rows into the batch axis and unfold
them again (gpt2's ``[-1, 256]`` before its projections, attention heads split off a
sequence-first tensor): each of N samples gets its batch-1 result; inputs holding the batch
folded differently are refused with the reason."""

import numpy as np
import pytest

import flowrt
from flowrt import descriptors as d
from flowrt.engine.graph.passes.batch import set_batch
from flowrt.errors import ShapeError
from flowrt.types import TensorInfo

BATCH = 3
RNG = np.random.default_rng(8)


def _random(*shape: int) -> np.ndarray:
    return RNG.standard_normal(shape).astype(np.float32)


def _reshape(net, x, *target):
    return net.add_layer("Reshape", inputs=[x, np.array(target, np.int64)])


def _rows_folded() -> flowrt.Network:
    """x (1, 4, 6) -> [-1, 6]: (4, 6), the sample's 4 rows on axis 0 -> MatMul (6, 5) + Relu
    -> [1, 4, 5]: unfolded."""
    net = flowrt.Network()
    x = net.add_input("x", TensorInfo((1, 4, 6)))
    rows = _reshape(net, x, -1, 6)
    projected = net.add_layer("Relu", inputs=[net.add_layer("MatMul", inputs=[rows, _random(6, 5)])])
    net.add_output("y", _reshape(net, projected, 1, 4, 5))
    return net


def _heads_folded() -> flowrt.Network:
    """Sequence-first attention: x (1, 5, 8) -> (5, 1, 8) -> [5, 2, 4]: the sample's 2 heads
    on axis 1 -> heads first (2, 5, 4) -> softmax(Q K^T) V per head -> (5, 2, 4) -> [5, 1, 8]
    -> (1, 5, 8)."""
    net = flowrt.Network()
    x = net.add_input("x", TensorInfo((1, 5, 8)))
    seq_first = net.add_layer("Transpose", d.Transpose(perm=(1, 0, 2)), inputs=[x])
    heads = net.add_layer(
        "Transpose", d.Transpose(perm=(1, 0, 2)), inputs=[_reshape(net, seq_first, 5, 2, 4)]
    )
    keys = net.add_layer("Transpose", d.Transpose(perm=(0, 2, 1)), inputs=[heads])
    scores = net.add_layer(
        "Softmax", d.Softmax(axis=-1), inputs=[net.add_layer("MatMul", inputs=[heads, keys])]
    )
    mixed = net.add_layer("MatMul", inputs=[scores, heads])
    back = net.add_layer("Transpose", d.Transpose(perm=(1, 0, 2)), inputs=[mixed])
    joined = _reshape(net, back, 5, 1, 8)
    net.add_output("y", net.add_layer("Transpose", d.Transpose(perm=(1, 0, 2)), inputs=[joined]))
    return net


async def _per_sample(net: flowrt.Network) -> list[str]:
    """Run ``net`` re-batched to 3 and at batch 1 on each sample: the rows agree. Returns the
    re-batching lines of the optimizer's report."""
    opt = flowrt.optimize(net, backends=["CpuAcc", "CpuRef"])
    async with flowrt.Runtime() as rt:
        one = await rt.load(opt)
        many = await rt.load(opt, batch=BATCH)
        x = _random(BATCH, *one.inputs["x"].shape[1:])
        got = (await many.run({"x": x}))["y"]
        for i in range(BATCH):
            expected = (await one.run({"x": x[i : i + 1]}))["y"]
            np.testing.assert_allclose(got[i : i + 1], expected, rtol=1e-5, atol=1e-6)
    return [line for line in set_batch(opt, BATCH).passes if "re-batched" in line]


async def test_rows_folded_into_the_batch_axis_and_unfolded_keep_each_sample_apart():
    lines = await _per_sample(_rows_folded())
    # [-1, 6] infers N * 4 rows as it is; [1, 4, 5] is rewritten
    assert len(lines) == 1 and lines[0].endswith("target [1, 4, 5] -> [3, 4, 5]")


async def test_attention_heads_folded_beside_the_sequence_keep_each_sample_apart():
    lines = await _per_sample(_heads_folded())
    assert [line.split(": ")[1] for line in lines] == [
        "target [5, 2, 4] -> [5, 6, 4]",
        "target [5, 1, 8] -> [5, 3, 8]",
    ]


def test_inputs_holding_the_batch_folded_differently_are_refused():
    net = flowrt.Network()
    x = net.add_input("x", TensorInfo((1, 4)))
    folded = _reshape(net, x, 2, 2)  # the sample's 4 values as 2 rows
    half = net.add_layer(
        "Slice", inputs=[x, np.array([0], np.int64), np.array([2], np.int64), np.array([1], np.int64)]
    )  # (1, 2): one row
    net.add_output("y", net.add_layer("Add", inputs=[folded, half], name="suspect"))
    with pytest.raises(ShapeError, match=r"'suspect' \(Add\): its inputs hold \[1, 2\] rows of each sample"):
        set_batch(net, 2)
