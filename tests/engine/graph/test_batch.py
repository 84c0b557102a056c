"""Re-batching: per-sample results match batch 1, hard-coded batch-1 reshapes are rewritten,
weights are shared, and a network that could mix samples is refused naming the layer."""

import numpy as np
import pytest

import flowrt
from flowrt import descriptors as d
from flowrt.engine.graph.passes.batch import set_batch
from flowrt.errors import ShapeError
from flowrt.types import TensorInfo

RNG = np.random.default_rng(7)


def _random(*shape: int) -> np.ndarray:
    return RNG.standard_normal(shape).astype(np.float32)


def _conv_reshape_gemm(reshape_as_attribute: bool = False) -> flowrt.Network:
    """x (1, 4, 3, 3) -> Conv -> Reshape [1, 54] -> Gemm -> y: alexnet's head, small."""
    net = flowrt.Network()
    x = net.add_input("x", TensorInfo((1, 4, 3, 3)))
    conv = net.add_layer("Conv", d.Conv(pads=(1, 1, 1, 1)), inputs=[x, _random(6, 4, 3, 3)], name="conv")
    if reshape_as_attribute:
        flat = net.add_layer("Reshape", d.Reshape(shape=(1, 54)), inputs=[conv], name="flat")
    else:
        flat = net.add_layer("Reshape", inputs=[conv, np.array([1, 54], np.int64)], name="flat")
    gemm = net.add_layer("Gemm", d.Gemm(transB=1), inputs=[flat, _random(5, 54), _random(5)], name="fc")
    net.add_output("y", gemm)
    return net


def _channel_shuffle() -> flowrt.Network:
    """shufflenet's shuffle: Reshape [1, 2, 3, 2, 2] -> Transpose (0, 2, 1, 3, 4) -> Reshape [1, 6, 2, 2]."""
    net = flowrt.Network()
    x = net.add_input("x", TensorInfo((1, 6, 2, 2)))
    split = net.add_layer("Reshape", inputs=[x, np.array([1, 2, 3, 2, 2], np.int64)], name="split")
    swap = net.add_layer("Transpose", d.Transpose(perm=(0, 2, 1, 3, 4)), inputs=[split], name="swap")
    merge = net.add_layer("Reshape", inputs=[swap, np.array([1, 6, 2, 2], np.int64)], name="merge")
    net.add_output("y", merge)
    return net


async def _per_sample_matches(net: flowrt.Network, batch: int) -> None:
    opt = flowrt.optimize(net, backends=["CpuRef"])
    async with flowrt.Runtime() as rt:
        one = await rt.load(opt)
        many = await rt.load(opt, batch=batch)
        ((name, info),) = many.inputs.items()
        x = _random(*info.shape)
        (got,) = (await many.run({name: x})).values()
        assert got.shape[0] == batch
        for i in range(batch):
            (expected,) = (await one.run({name: x[i : i + 1]})).values()
            np.testing.assert_allclose(got[i : i + 1], expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("as_attribute", [False, True])
async def test_reshape_with_batch_one_target_is_rewritten_and_samples_stay_apart(as_attribute):
    net = _conv_reshape_gemm(as_attribute)
    batched = set_batch(net, 3)
    (flat,) = [layer for layer in batched.graph if layer.name == "flat"]
    assert flat.outputs[0].info.shape == (3, 54)
    assert net.inputs["x"].shape == (1, 4, 3, 3)  # the original is unchanged
    await _per_sample_matches(net, 3)


async def test_channel_shuffle_keeps_each_sample_its_own_channels():
    net = _channel_shuffle()
    opt = set_batch(flowrt.optimize(net, backends=["CpuRef"]), 2)
    assert [line for line in opt.passes if "re-batched" in line] == [
        "re-batched Reshape 'split': target [1, 2, 3, 2, 2] -> [2, 2, 3, 2, 2]",
        "re-batched Reshape 'merge': target [1, 6, 2, 2] -> [2, 6, 2, 2]",
    ]
    await _per_sample_matches(net, 2)


def test_weights_are_shared_not_copied():
    opt = flowrt.optimize(_conv_reshape_gemm(), backends=["CpuRef"])
    batched = set_batch(opt, 4)
    weights = {id(layer.descriptor.value) for layer in opt.graph.of_kind("Constant")}
    shared = [layer for layer in batched.graph.of_kind("Constant") if id(layer.descriptor.value) in weights]
    assert len(shared) == len(opt.graph.of_kind("Constant")) - 1  # all but the reshape target
    assert opt.graph.input_layers[0].descriptor.info.shape == (1, 4, 3, 3)  # the original is unchanged
    assert batched.graph.input_layers[0].descriptor.info.shape == (4, 4, 3, 3)


def _single(kind, descriptor, in_shape, *constants, out_name="y"):
    net = flowrt.Network()
    x = net.add_input("x", TensorInfo(in_shape))
    layer = net.add_layer(kind, descriptor, inputs=[x, *constants], name="suspect")
    net.add_output(out_name, layer)
    return net


@pytest.mark.parametrize(
    "net, reason",
    [
        (
            _single("Reshape", None, (1, 4), np.array([2, 2], np.int64)),
            # each sample's 4 elements folded into 2 rows, and left so at the output
            r"cannot batch output 'y': its axis 0 holds 2 rows of each sample; one is expected",
        ),
        (
            _single("Concat", d.Concat(axis=0), (1, 4), _random(1, 4)),
            r"layer 'suspect' \(Concat\): every input must carry the batch on one axis",
        ),
        (
            _single("ReduceSum", d.ReduceSum(keepdims=1), (1, 4), np.array([0], np.int64)),
            r"layer 'suspect' \(ReduceSum\): it reduces axes \[0\], which include the batch axis 0",
        ),
        (
            _single("Add", None, (1, 4), _random(3, 4)),
            r"input 1 does not carry the batch but has 3 on the batch axis 0; 1 is expected",
        ),
        (
            _single("Flatten", d.Flatten(axis=0), (1, 4)),
            r"layer 'suspect' \(Flatten\): with axis 0 it folds the batch into the columns",
        ),
        (
            _single("Softmax", d.Softmax(axis=0, opset=11), (1, 4)),
            r"before opset 13 it normalizes over axes 0 and on, which hold the batch",
        ),
        (_single("NonZero", None, (1, 4)), r"flowrt has no batching rule for NonZero layers"),
        (
            _single("Transpose", d.Transpose(perm=(1, 0)), (1, 4), out_name="t"),
            r"cannot batch output 't': it carries the batch on axis 1; axis 0 is expected",
        ),
        (
            _single("Flatten", d.Flatten(axis=2), (1, 2, 3)),
            # each sample's 2 rows folded into the batch axis, and left so at the output
            r"cannot batch output 'y': its axis 0 holds 2 rows of each sample; one is expected",
        ),
        (
            _single("Squeeze", None, (1, 4)),
            r"without axes it squeezes every dim of 1, the batch of 1 included",
        ),
    ],
)
def test_what_could_mix_samples_is_refused_naming_the_layer(net, reason):
    with pytest.raises(ShapeError, match=reason):
        set_batch(net, 2)


def test_an_input_exported_with_another_batch_is_refused():
    net = _single("Relu", None, (2, 4))
    with pytest.raises(ShapeError, match=r"input 'x': a leading batch dim of 1 .* found shape \(2, 4\)"):
        set_batch(net, 8)


def test_axis_rules_follow_the_batch_through_unsqueeze_squeeze_and_matmul():
    net = flowrt.Network()
    x = net.add_input("x", TensorInfo((1, 4)))
    up = net.add_layer("Unsqueeze", d.Unsqueeze(axes=(1,)), inputs=[x, None])
    mm = net.add_layer("MatMul", inputs=[up, _random(4, 3)])
    down = net.add_layer("Squeeze", d.Squeeze(axes=(1,)), inputs=[mm])
    net.add_output("y", down)
    batched = set_batch(net, 5)
    batched.graph.infer_shapes()
    assert batched.graph.output_layers[0].input_infos[0].shape == (5, 3)


def _attention_projection(after: str = "unfold") -> flowrt.Network:
    """The output projection of torch's multi-head attention as exported: (1, 5, 8) ->
    Transpose -> (5, 1, 8) -> Reshape [5, 8] -> Gemm -> then ``after``: "unfold" (Reshape [5,
    1, 8] -> Transpose -> (1, 5, 8), as exported), "softmax" (over the rows), "flatten"
    (Reshape [40]), "copy" (Reshape [0, 1, 8]) or "output" (the Gemm's rows are the output)."""
    net = flowrt.Network()
    x = net.add_input("x", TensorInfo((1, 5, 8)))
    seq_first = net.add_layer("Transpose", d.Transpose(perm=(1, 0, 2)), inputs=[x], name="seq_first")
    rows = net.add_layer("Reshape", inputs=[seq_first, np.array([5, 8], np.int64)], name="rows")
    proj = net.add_layer("Gemm", d.Gemm(transB=1), inputs=[rows, _random(8, 8), _random(8)], name="proj")
    if after == "unfold":
        back = net.add_layer("Reshape", inputs=[proj, np.array([5, 1, 8], np.int64)], name="back")
        proj = net.add_layer("Transpose", d.Transpose(perm=(1, 0, 2)), inputs=[back], name="batch_first")
    elif after == "softmax":
        proj = net.add_layer("Softmax", d.Softmax(axis=0), inputs=[proj], name="suspect")
    elif after == "flatten":
        proj = net.add_layer("Reshape", inputs=[proj, np.array([40], np.int64)], name="suspect")
    elif after == "copy":  # a 0 copies the rows' axis, N times longer at batch N
        proj = net.add_layer("Reshape", inputs=[proj, np.array([0, 1, 8], np.int64)], name="suspect")
    net.add_output("y", proj)
    return net


async def test_rows_of_every_sample_interleaved_for_a_gemm_are_unfolded_after_it():
    """(5, N, 8) reshaped to rows: [5, 8] becomes [5N, 8], row s * N + n being sample n's row
    s; folding each sample's 8 features into the columns instead ([5, 8N]) would make the
    Gemm's dot products run across samples. The Reshape back gives the samples an axis."""
    net = _attention_projection()
    opt = set_batch(flowrt.optimize(net, backends=["CpuRef"]), 3)
    assert [line for line in opt.passes if "re-batched" in line] == [
        "re-batched Reshape 'rows': target [5, 8] -> [15, 8]",
        "re-batched Reshape 'back': target [5, 1, 8] -> [5, 3, 8]",
    ]
    await _per_sample_matches(net, 3)


@pytest.mark.parametrize(
    "after, reason",
    [
        (
            "softmax",
            r"layer 'suspect' \(Softmax\): an input carries the batch interleaved with other rows on axis 0",
        ),
        (
            "flatten",
            r"layer 'suspect' \(Reshape\): its input carries the batch interleaved on axis 0 of \(5, 8\)",
        ),
        ("output", r"cannot batch output 'y': it carries the batch interleaved with other rows on axis 0"),
        (
            "copy",
            r"layer 'suspect' \(Reshape\): its target \[0, 1, 8\] copies the axis the batch is interleaved on",
        ),
    ],
)
def test_interleaved_rows_reaching_what_could_mix_them_are_refused(after, reason):
    with pytest.raises(ShapeError, match=reason):
        set_batch(_attention_projection(after), 2)


async def test_a_flatten_folding_each_samples_rows_into_the_batch_axis_is_unfolded_later():
    """A Flatten whose leading dims join the batch (TorchScript's attention masks, (1, 1, 128)
    -> (128, 1)) folds each sample's rows into axis 0, as a Reshape may; a Gemm over the rows
    keeps them, and a Reshape with the batch of 1 in its target unfolds them."""
    net = flowrt.Network()
    x = net.add_input("x", TensorInfo((1, 2, 3)))
    rows = net.add_layer("Flatten", d.Flatten(axis=2), inputs=[x], name="rows")
    gemm = net.add_layer("Gemm", d.Gemm(transB=1), inputs=[rows, _random(4, 3), _random(4)], name="fc")
    back = net.add_layer("Reshape", inputs=[gemm, np.array([1, 2, 4], np.int64)], name="back")
    net.add_output("y", back)
    opt = set_batch(flowrt.optimize(net, backends=["CpuRef"]), 3)
    assert [line for line in opt.passes if "re-batched" in line] == [
        "re-batched Reshape 'back': target [1, 2, 4] -> [3, 2, 4]"
    ]
    await _per_sample_matches(net, 3)
