"""Re-batching rules for Pad, Resize, Upsample, Slice, Expand, Tile, Concat with a one-sample
constant, RMS and mean-variance normalization, RNN/GRU/LSTM, batched MatMul, Reshape off
axis 0 and Flatten: a network made for batch 1, re-batched to 3, gives each sample what the
batch-1 network gives it alone; where samples could mix the layer is refused with the reason."""

import numpy as np
import pytest

import flowrt
from flowrt import descriptors as d
from flowrt.engine.graph.passes.batch import set_batch
from flowrt.errors import ShapeError
from flowrt.types import TensorInfo

RNG = np.random.default_rng(11)
BATCH = 3


def _random(*shape: int) -> np.ndarray:
    return RNG.standard_normal(shape).astype(np.float32)


def _single(kind, descriptor, in_shape, *constants, name="suspect"):
    """x -> one layer (x first, then ``constants``; None leaves an optional input out) -> y."""
    net = flowrt.Network()
    x = net.add_input("x", TensorInfo(in_shape))
    layer = net.add_layer(kind, descriptor, inputs=[x, *constants], name=name)
    net.add_output("y", layer)
    return net


async def _per_sample_matches(net: flowrt.Network) -> list[str]:
    """Run ``net`` re-batched to 3 and at batch 1 on each sample: the rows must agree. Returns
    the re-batching lines of the optimizer's report."""
    opt = flowrt.optimize(net, backends=["CpuRef"])
    async with flowrt.Runtime() as rt:
        one = await rt.load(opt)
        many = await rt.load(opt, batch=BATCH)
        ((name, info),) = many.inputs.items()
        x = _random(*info.shape)
        (got,) = (await many.run({name: x})).values()
        assert got.shape[0] == BATCH
        for i in range(BATCH):
            (expected,) = (await one.run({name: x[i : i + 1]})).values()
            np.testing.assert_allclose(got[i : i + 1], expected, rtol=1e-5, atol=1e-6)
    return [line for line in set_batch(opt, BATCH).passes if "re-batched" in line]


def _recurrent(kind: str, layout: int, states: bool, lengths: bool = False) -> flowrt.Network:
    """x (1, 5, 4) -> [Transpose to (5, 1, 4) for layout 0] -> a 2-direction recurrent layer
    with constant one-sample initial states -> Y with the batch moved back to axis 0."""
    hidden, gates = 3, {"RNN": 1, "GRU": 3, "LSTM": 4}[kind]
    net = flowrt.Network()
    x = net.add_input("x", TensorInfo((1, 5, 4)))
    seq_first = net.add_layer("Transpose", d.Transpose(perm=(1, 0, 2)), inputs=[x]) if layout == 0 else x
    state = _random(2, 1, hidden) if layout == 0 else _random(1, 2, hidden)
    inputs = [
        seq_first,
        _random(2, gates * hidden, 4),
        _random(2, gates * hidden, hidden),
        _random(2, 2 * gates * hidden),
    ]
    inputs += [np.array([4], np.int32) if lengths else None, state if states else None]
    if kind == "LSTM":
        inputs.append(state * 2 if states else None)
    desc = getattr(d, kind)(hidden_size=hidden, direction="bidirectional", layout=layout)
    rnn = net.add_layer(kind, desc, inputs=inputs, name="rnn")
    # Y is (seq, dirs, batch, hidden) with layout 0, (batch, seq, dirs, hidden) with layout 1.
    perm = (2, 0, 1, 3) if layout == 0 else (0, 1, 2, 3)
    net.add_output("y", net.add_layer("Transpose", d.Transpose(perm=perm), inputs=[rnn.outputs[0]]))
    return net


def _attention_scores() -> flowrt.Network:
    """x (1, 2, 4, 8) -> Q = x W, K = x V -> Q K^T: both MatMul inputs carry the batch."""
    net = flowrt.Network()
    x = net.add_input("x", TensorInfo((1, 2, 4, 8)))
    q = net.add_layer("MatMul", inputs=[x, _random(8, 8)])
    k = net.add_layer("MatMul", inputs=[x, _random(8, 8)])
    kt = net.add_layer("Transpose", d.Transpose(perm=(0, 1, 3, 2)), inputs=[k])
    net.add_output("y", net.add_layer("MatMul", inputs=[q, kt], name="scores"))
    return net


def _reshape_after_batch_axis() -> flowrt.Network:
    """x (1, 6, 4) -> (6, 1, 4) -> Reshape [6, 1, 2, 2] (batch on axis 1) -> back to axis 0."""
    net = flowrt.Network()
    x = net.add_input("x", TensorInfo((1, 6, 4)))
    seq_first = net.add_layer("Transpose", d.Transpose(perm=(1, 0, 2)), inputs=[x])
    split = net.add_layer("Reshape", inputs=[seq_first, np.array([6, 1, 2, 2], np.int64)], name="split")
    net.add_output("y", net.add_layer("Transpose", d.Transpose(perm=(1, 0, 2, 3)), inputs=[split]))
    return net


PER_SAMPLE = {
    "pad": _single("Pad", d.Pad(mode="reflect"), (1, 2, 4, 4), np.array([0, 0, 1, 2, 0, 0, 2, 1], np.int64)),
    "pad with axes": _single(
        "Pad",
        None,
        (1, 2, 4),
        np.array([1, 2], np.int64),
        np.array(0.5, np.float32),
        np.array([-1], np.int64),
    ),
    "resize by scales": _single(
        "Resize", d.Resize(mode="linear"), (1, 2, 3, 3), None, np.array([1, 1, 2, 1.5], np.float32)
    ),
    "resize by sizes over axes": _single(
        "Resize", d.Resize(mode="cubic", axes=(0, 3)), (1, 2, 3, 3), None, None, np.array([1, 5], np.int64)
    ),
    "upsample": _single("Upsample", d.Upsample(scales=(1, 1, 2, 2)), (1, 2, 3, 3)),
    "rms norm": _single("RMSNormalization", d.RMSNormalization(axis=-2), (1, 2, 3, 4), _random(3, 4)),
    "mean variance norm": _single(
        "MeanVarianceNormalization", d.MeanVarianceNormalization(axes=(2, 3)), (1, 2, 3, 3)
    ),
    "slice": _single(
        "Slice",
        None,
        (1, 4, 6),
        np.array([0, 1, -5], np.int64),
        np.array([2**63 - 1, 3, 100], np.int64),
        np.array([0, 1, 2], np.int64),
        np.array([1, 1, 2], np.int64),
    ),
    "expand": _single("Expand", None, (1, 3, 1), np.array([3, 4], np.int64)),
    "tile": _single("Tile", None, (1, 2, 3), np.array([1, 2, 3], np.int64)),
    "lstm layout 0": _recurrent("LSTM", 0, states=True),
    "gru layout 1": _recurrent("GRU", 1, states=True),
    "rnn with lengths": _recurrent("RNN", 0, states=False, lengths=True),
    "matmul of two batched": _attention_scores(),
    "reshape after the batch axis": _reshape_after_batch_axis(),
}


@pytest.mark.parametrize("net", PER_SAMPLE.values(), ids=PER_SAMPLE.keys())
async def test_rebatched_network_gives_each_sample_its_batch_one_result(net):
    await _per_sample_matches(net)


async def test_constants_made_for_one_sample_are_repeated_for_each():
    # vit's head: a constant class token (1, 1, 4) joined before the patches (1, 3, 4).
    net = flowrt.Network()
    x = net.add_input("x", TensorInfo((1, 3, 4)))
    net.add_output("y", net.add_layer("Concat", d.Concat(axis=1), inputs=[_random(1, 1, 4), x], name="cat"))
    assert await _per_sample_matches(net) == [
        "re-batched Concat 'cat': input 0 repeated for each of 3 samples"
    ]
    assert await _per_sample_matches(_recurrent("LSTM", 0, states=True)) == [
        "re-batched LSTM 'rnn': initial_h, initial_c repeated for each of 3 samples"
    ]


async def test_resize_sizes_that_keep_the_batch_of_one_are_rewritten():
    net = _single("Resize", d.Resize(), (1, 2, 3, 3), None, None, np.array([1, 2, 6, 6], np.int64))
    assert await _per_sample_matches(net) == [
        "re-batched Resize 'suspect': sizes [1, 2, 6, 6] -> [3, 2, 6, 6]"
    ]


def _computed(kind: str, *inputs, **layer) -> flowrt.Network:
    """``kind`` fed x (of shape ``inputs[0]``) and ``inputs[2:]``, where "computed" marks an input
    that does not carry the batch but is computed at run time: Relu of ``inputs[1]``
    (``set_batch`` of a Network folds nothing)."""
    net = flowrt.Network()
    x = net.add_input("x", TensorInfo(inputs[0]))
    relu = net.add_layer("Relu", inputs=[inputs[1]])
    rest = [relu if isinstance(i, str) else i for i in inputs[2:]]
    net.add_output("y", net.add_layer(kind, layer.pop("descriptor", None), inputs=[x, *rest], name="suspect"))
    return net


def _moved(kind: str, perm: tuple[int, ...], *inputs) -> flowrt.Network:
    """x (1, 3, 3) -> Transpose ``perm`` (the batch leaves axis 0) -> ``kind`` fed ``inputs``,
    where "x" and "moved" stand for the input and the transposed tensor."""
    net = flowrt.Network()
    x = net.add_input("x", TensorInfo((1, 3, 3)))
    moved = net.add_layer("Transpose", d.Transpose(perm=perm), inputs=[x])
    named = {"x": x, "moved": moved}
    fed = [named[i] if isinstance(i, str) else i for i in inputs]
    net.add_output("y", net.add_layer(kind, inputs=fed, name="suspect"))
    return net


REFUSED = {
    "pad": (
        _single("Pad", None, (1, 4), np.array([1, 0, 0, 0], np.int64)),
        r"\(Pad\): it pads the batch axis 0 by \(1, 0\); \(0, 0\) is expected",
    ),
    "resize": (
        _single("Resize", d.Resize(), (1, 2, 3, 3), None, np.array([2, 1, 1, 1], np.float32)),
        r"\(Resize\): its scales \[2.0, 1.0, 1.0, 1.0\] scale the batch axis 0; 1 is expected",
    ),
    "resize sizes": (
        _single("Resize", d.Resize(), (1, 2, 3, 3), None, None, np.array([2, 2, 3, 3], np.int64)),
        r"\(Resize\): its sizes \[2, 2, 3, 3\] resize the batch axis 0 from 1 to 2",
    ),
    "upsample": (
        _single("Upsample", d.Upsample(scales=(2, 1)), (1, 3)),
        r"\(Upsample\): its scales \[2.0, 1.0\] scale the batch axis 0; 1 is expected",
    ),
    "rms norm": (
        _single("RMSNormalization", d.RMSNormalization(axis=0), (1, 4), _random(1, 4)),
        r"\(RMSNormalization\): it normalizes over axes 0 and on, which hold the batch",
    ),
    "mean variance norm": (
        _single("MeanVarianceNormalization", None, (1, 2, 3, 3)),
        r"\(MeanVarianceNormalization\): it normalizes over axes \[0, 2, 3\], which include the batch axis 0",
    ),
    "slice": (
        _single("Slice", None, (1, 4), np.array([0], np.int64), np.array([1], np.int64)),
        r"\(Slice\): it slices the batch axis 0 as \[0:1:1\]; only the whole axis",
    ),
    "expand": (
        _single("Expand", None, (1, 4), np.array([2, 4], np.int64)),
        r"\(Expand\): its target shape \[2, 4\] has 2 on the batch axis 0; 1 is expected",
    ),
    "tile": (
        _single("Tile", None, (1, 4), np.array([2, 1], np.int64)),
        r"\(Tile\): it repeats the batch axis 0 2 times; 1 is expected",
    ),
    "concat": (
        _computed("Concat", (1, 4), _random(1, 2), "computed", descriptor=d.Concat(axis=1)),
        r"\(Concat\): input 1 does not carry the batch and is computed at run time",
    ),
    "lstm input": (
        _single("LSTM", d.LSTM(hidden_size=2), (1, 5, 4), _random(1, 8, 4), _random(1, 8, 2)),
        r"\(LSTM\): X carries the batch on axis 0; axis 1 is expected \(layout 0\)",
    ),
    "gru state": (
        _computed(
            "GRU",
            (1, 5, 4),
            _random(1, 1, 2),
            _random(1, 6, 4),
            _random(1, 6, 2),
            None,
            None,
            "computed",
            descriptor=d.GRU(hidden_size=2, layout=1),
        ),
        r"\(GRU\): initial_h does not carry the batch and is computed at run time",
    ),
    "matmul": (
        _moved("MatMul", (1, 2, 0), "x", "moved"),
        r"\(MatMul\): input 1 carries the batch on axis 2, one of its matrix axes",
    ),
    "reshape": (
        _moved("Reshape", (1, 0, 2), "moved", np.array([9], np.int64)),
        r"\(Reshape\): its target \[9\] regroups the dims before the batch axis 1: \(3, 1, 3\) becomes \(9,\)",
    ),
}


@pytest.mark.parametrize(("net", "reason"), REFUSED.values(), ids=REFUSED.keys())
def test_layer_that_could_mix_samples_is_refused_with_the_reason(net, reason):
    with pytest.raises(ShapeError, match=r"cannot batch layer 'suspect' " + reason):
        set_batch(net, 2)
