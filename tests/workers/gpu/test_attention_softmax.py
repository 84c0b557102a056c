"""Attention's scores scaled, masked and normalized as one AttentionSoftmax on GpuAcc: the
kernel against CpuRef over masks that broadcast in every way attention uses, and the fusion
through the optimizer and the public API against ONNX Runtime, batched and saved."""

import numpy as np
import onnxruntime as ort
import pytest
import trio
from fusedruns import alone_and_batched, lone_runs
from onnx import TensorProto, helper, numpy_helper

import flowrt
from flowrt.errors import ShapeError
from flowrt.types import TensorInfo
from flowrt.workers.cpu.ref.kernels import load_all as ref_kernels
from flowrt.workers.gpu.kernels.normalization import mask_layout

BATCH, HEADS, SEQ, DEPTH = 1, 2, 12, 8


def test_cpuref_scales_adds_the_broadcast_mask_and_normalizes_the_last_axis():
    rng = np.random.default_rng(0)
    x, mask = rng.standard_normal((2, 3, 4, 5)), rng.standard_normal((2, 1, 1, 5))
    y = ref_kernels()["AttentionSoftmax"](flowrt.descriptors.AttentionSoftmax(scale=0.5), x, mask)
    e = np.exp(x * 0.5 + mask - (x * 0.5 + mask).max(axis=-1, keepdims=True))
    np.testing.assert_allclose(y, e / e.sum(axis=-1, keepdims=True), rtol=1e-12)
    plain = ref_kernels()["AttentionSoftmax"](flowrt.descriptors.AttentionSoftmax(), x)
    np.testing.assert_allclose(plain, ref_kernels()["Softmax"](flowrt.descriptors.Softmax(), x))


def test_a_mask_that_does_not_broadcast_to_the_scores_is_a_shape_error():
    net = flowrt.Network()
    x = net.add_input("x", TensorInfo((2, 3, 4)))
    mask = net.add_input("mask", TensorInfo((2, 1, 5)))
    net.add_output("y", net.add_layer("AttentionSoftmax", flowrt.descriptors.AttentionSoftmax(), [x, mask]))
    with pytest.raises(ShapeError, match=r"mask that broadcasts to X's shape \(2, 3, 4\), got \(2, 1, 5\)"):
        flowrt.optimize(net, backends=["CpuRef"])


def test_mask_layout_folds_the_leading_dims_into_three_with_zero_strides_where_it_broadcasts():
    assert mask_layout((2, 4, 6, 6), (2, 1, 1, 6)) == ([1, 2, 4 * 6], [0, 6, 0], 1)  # padding
    assert mask_layout((2, 4, 6, 6), (1, 1, 6, 6)) == ([1, 2 * 4, 6], [0, 0, 6], 1)  # causal
    assert mask_layout((2, 4, 6, 6), (2, 1, 6, 6)) == ([2, 4, 6], [36, 0, 6], 1)
    assert mask_layout((2, 4, 6, 6), (6,)) == ([1, 1, 2 * 4 * 6], [0, 0, 0], 1)
    assert mask_layout((2, 4, 6, 6), (6, 1)) == ([1, 2 * 4, 6], [0, 0, 1], 0)
    assert mask_layout((2, 3, 4, 5, 6), (2, 1, 4, 1, 6)) is None  # four runs of strides


MASKS = {
    "none": None,
    "padding": (BATCH, 1, 1, SEQ),
    "causal": (1, 1, SEQ, SEQ),
    "per_sample": (BATCH, 1, SEQ, SEQ),
    "full": (BATCH, HEADS, SEQ, SEQ),
    "row": (SEQ,),
    "column": (SEQ, 1),
}


@pytest.mark.parametrize("mask", MASKS)
@pytest.mark.parametrize("length", [5, SEQ, 300])
def test_the_kernel_matches_cpuref_for_every_broadcast_of_the_mask(run_both, mask, length):
    rng = np.random.default_rng(length)
    x = (rng.standard_normal((3, HEADS, SEQ, length)) * 4).astype(np.float32)
    inputs = [x]
    if MASKS[mask] is not None:
        shape = tuple(
            length if d == SEQ and i == len(MASKS[mask]) - 1 else d for i, d in enumerate(MASKS[mask])
        )
        shape = tuple(3 if d == BATCH and i == 0 and len(shape) == 4 else d for i, d in enumerate(shape))
        m = np.where(rng.random(shape) < 0.3, np.float32(-1e9), rng.standard_normal(shape)).astype(np.float32)
        inputs.append(m)
    (got,), (expected,) = run_both(
        "AttentionSoftmax", flowrt.descriptors.AttentionSoftmax(scale=0.35), inputs
    )
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-7)


def test_the_kernel_stores_half_and_masked_positions_get_nothing(run_half):
    x = np.random.default_rng(3).standard_normal((2, 2, 4, 40)).astype(np.float32)
    mask = np.zeros((2, 1, 1, 40), np.float32)
    mask[0, ..., 10:] = -30000.0  # beyond exp's range in half: masked out
    mask[1] = -30000.0  # every position masked: the scores still rank them
    (got,), (expected,) = run_half(
        "AttentionSoftmax", flowrt.descriptors.AttentionSoftmax(scale=0.125), [x, mask]
    )
    np.testing.assert_allclose(got, expected, rtol=1e-2, atol=1e-3)
    assert np.all(got[0, ..., 10:] == 0)
    np.testing.assert_allclose(got[1].sum(axis=-1), 1, rtol=1e-2)


def _attention(scale_op: str, mask: str | None) -> bytes:
    """q, k, v (batch, heads, seq, depth) -> softmax(q @ k^T scaled [+ mask]) @ v, the scale a
    ``Mul`` by 1/sqrt(depth) or a ``Div`` by sqrt(depth) (as exporters write it), the mask a
    padding mask (batch, 1, 1, seq) fed at run time or a constant causal one (1, 1, seq, seq)."""
    dims = [BATCH, HEADS, SEQ, DEPTH]
    inputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, dims) for n in "qkv"]
    inits = [
        numpy_helper.from_array(np.float32(1 / np.sqrt(DEPTH)), "inv"),
        numpy_helper.from_array(np.float32(np.sqrt(DEPTH)), "root"),
    ]
    nodes = [
        helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 1, 3, 2]),
        helper.make_node("MatMul", ["q", "kt"], ["s"]),
        helper.make_node(scale_op, ["s", "inv" if scale_op == "Mul" else "root"], ["scaled"]),
    ]
    scores = "scaled"
    if mask == "padding":
        inputs.append(helper.make_tensor_value_info("mask", TensorProto.FLOAT, [BATCH, 1, 1, SEQ]))
    elif mask == "causal":
        causal = np.triu(np.full((SEQ, SEQ), np.finfo(np.float32).min, np.float32), 1)[None, None]
        inits.append(numpy_helper.from_array(causal, "mask"))
    if mask is not None:
        nodes.append(helper.make_node("Add", ["mask", "scaled"], ["masked"]))  # the mask first
        scores = "masked"
    nodes += [
        helper.make_node("Softmax", [scores], ["p"], axis=-1),
        helper.make_node("MatMul", ["p", "v"], ["out"]),
    ]
    graph = helper.make_graph(
        nodes, "attention", inputs, [helper.make_tensor_value_info("out", TensorProto.FLOAT, dims)], inits
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()


def _feeds(seed: int, mask: str | None) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    feeds = {n: rng.standard_normal((BATCH, HEADS, SEQ, DEPTH)).astype(np.float32) for n in "qkv"}
    if mask == "padding":
        feeds["mask"] = np.where(np.arange(SEQ) < SEQ - 3 - seed, 0.0, -10000.0).astype(np.float32)[
            None, None, None
        ]
    return feeds


@pytest.mark.parametrize(("scale_op", "mask"), [("Mul", "padding"), ("Div", "causal"), ("Mul", None)])
def test_scale_mask_and_softmax_are_one_gpuacc_layer_that_matches_onnxruntime(gpu, scale_op, mask):
    model = _attention(scale_op, mask)
    opt = flowrt.optimize(flowrt.onnx.load(model), backends=["GpuAcc", "CpuRef"])
    (fused,) = [layer for layer in opt.graph if layer.kind == "AttentionSoftmax"]
    assert fused.backend == "GpuAcc"
    assert fused.descriptor.scale == pytest.approx(1 / np.sqrt(DEPTH))
    assert (fused.inputs[1].source is not None) == (mask is not None)
    assert not [layer for layer in opt.graph if layer.kind in ("Mul", "Div", "Add", "Softmax")]
    session = ort.InferenceSession(model, providers=["CPUExecutionProvider"])

    for seed, got in enumerate(lone_runs(opt, [_feeds(seed, mask) for seed in range(3)])):
        np.testing.assert_allclose(got, session.run(None, _feeds(seed, mask))[0], rtol=1e-5, atol=1e-6)


def test_scores_read_elsewhere_are_not_fused(gpu):
    net = flowrt.Network()
    x = net.add_input("x", TensorInfo((1, 2, 4, 4)))
    scaled = net.add_layer("Mul", None, [x, np.float32(0.5)], name="scale")
    net.add_output("p", net.add_layer("Softmax", flowrt.descriptors.Softmax(axis=-1), [scaled]))
    net.add_output("scaled", scaled)  # the scaled scores are an output too
    opt = flowrt.optimize(net, backends=["GpuAcc", "CpuRef"])
    assert sorted(layer.kind for layer in opt.graph if layer.kind not in ("Input", "Output", "Constant")) == [
        "Mul",
        "Softmax",
    ]


def test_a_batching_stream_batches_the_fused_layer_each_sample_its_own_mask(gpu):
    opt = flowrt.optimize(flowrt.onnx.load(_attention("Mul", "padding")), backends=["GpuAcc", "CpuRef"])
    feeds = [_feeds(seed, "padding") for seed in range(4)]

    alone, batched, counts = alone_and_batched(opt, feeds)
    assert counts[4] == 1  # the four ran as one batch of the re-batched network
    for a, b in zip(alone, batched, strict=True):
        np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-6)


def test_the_fused_layer_round_trips_through_a_flowrt_file(gpu, tmp_path):
    opt = flowrt.optimize(flowrt.onnx.load(_attention("Div", "causal")), backends=["GpuAcc", "CpuRef"])
    flowrt.save(opt, tmp_path / "attention.flowrt")
    again = flowrt.load(tmp_path / "attention.flowrt")
    (fused,) = [layer for layer in again.graph if layer.kind == "AttentionSoftmax"]
    assert fused.descriptor.scale == pytest.approx(1 / np.sqrt(DEPTH))

    async def main():
        async with flowrt.Runtime(cpu_workers=1) as rt:
            return [(await (await rt.load(o)).run(_feeds(5, "causal")))["out"] for o in (opt, again)]

    first, second = trio.run(main)
    np.testing.assert_array_equal(first, second)
