"""Rotary position embedding as exported from Hugging Face's LLaMA (Slice, Slice, Neg, Concat,
Mul, Mul, Add) as one ApplyRotary on GpuAcc: the kernel against CpuRef, the fusion through the
optimizer and the public API against ONNX Runtime, batched and saved."""

import numpy as np
import onnxruntime as ort
import pytest
from fusedruns import alone_and_batched, lone_runs
from onnx import TensorProto, helper, numpy_helper

import flowrt
from flowrt.errors import ShapeError
from flowrt.types import TensorInfo
from flowrt.workers.cpu.ref.kernels import load_all as ref_kernels

HEADS, SEQ, DEPTH = 2, 6, 8
INT64_MAX = np.iinfo(np.int64).max


def test_cpuref_rotates_each_half_into_the_other():
    rng = np.random.default_rng(0)
    x, cos, sin = (
        rng.standard_normal((2, HEADS, SEQ, DEPTH)),
        rng.standard_normal((SEQ, DEPTH)),
        rng.standard_normal((SEQ, DEPTH)),
    )
    got = ref_kernels()["ApplyRotary"](flowrt.descriptors.ApplyRotary(), x, cos, sin)
    half = DEPTH // 2
    np.testing.assert_allclose(got[..., :half], x[..., :half] * cos[:, :half] - x[..., half:] * sin[:, :half])
    np.testing.assert_allclose(got[..., half:], x[..., half:] * cos[:, half:] + x[..., :half] * sin[:, half:])


@pytest.mark.parametrize(
    ("x", "cos", "message"),
    [
        ((1, SEQ, 7), (SEQ, 7), r"ApplyRotary expects X whose last dim is even, got \(1, 6, 7\)"),
        ((1, SEQ, DEPTH), (SEQ + 1, DEPTH), r"cos that broadcasts to X's shape \(1, 6, 8\), got \(7, 8\)"),
    ],
)
def test_an_odd_row_or_angles_that_do_not_broadcast_are_shape_errors(x, cos, message):
    net = flowrt.Network()
    inputs = [net.add_input(n, TensorInfo(s)) for n, s in (("x", x), ("cos", cos), ("sin", cos))]
    net.add_output("y", net.add_layer("ApplyRotary", flowrt.descriptors.ApplyRotary(), inputs))
    with pytest.raises(ShapeError, match=message):
        flowrt.optimize(net, backends=["CpuRef"])


ANGLES = {"shared": (1, 1, SEQ, DEPTH), "per_sample": (3, 1, SEQ, DEPTH), "plain": (SEQ, DEPTH)}


@pytest.mark.parametrize("angles", ANGLES)
def test_the_kernel_matches_cpuref(run_both, angles):
    rng = np.random.default_rng(1)
    x = rng.standard_normal((3, HEADS, SEQ, DEPTH)).astype(np.float32)
    cos, sin = (rng.standard_normal(ANGLES[angles]).astype(np.float32) for _ in range(2))
    (got,), (expected,) = run_both("ApplyRotary", flowrt.descriptors.ApplyRotary(), [x, cos, sin])
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)


def test_the_kernel_stores_half(run_half):
    rng = np.random.default_rng(2)
    x = rng.standard_normal((1, HEADS, SEQ, DEPTH)).astype(np.float32)
    cos, sin = (rng.standard_normal((1, 1, SEQ, DEPTH)).astype(np.float32) for _ in range(2))
    (got,), (expected,) = run_half("ApplyRotary", flowrt.descriptors.ApplyRotary(), [x, cos, sin])
    np.testing.assert_allclose(got, expected, rtol=1e-2, atol=1e-2)


def _rotary(split: int = DEPTH // 2, swapped: bool = False, transposed: bool = False) -> bytes:
    """q (batch, heads, seq, depth), cos and sin (batch, 1, seq, depth) -> q * cos +
    rotate_half(q) * sin as LLaMA's export writes it (``split`` other than half: not a
    rotation; ``swapped``: every operand order reversed; ``transposed``: q is fed as (batch,
    seq, heads, depth) and transposed heads first, as LLaMA's attention does)."""
    consts = {"lo": [0], "mid": [split], "end": [INT64_MAX], "axis": [3], "one": [1]}
    inits = [numpy_helper.from_array(np.array(v, np.int64), k) for k, v in consts.items()]

    def pair(a, b):
        return [b, a] if swapped else [a, b]

    nodes = [helper.make_node("Transpose", ["fed"], ["q"], perm=[0, 2, 1, 3])] if transposed else []
    nodes += [
        helper.make_node("Slice", ["q", "lo", "mid", "axis", "one"], ["first"]),
        helper.make_node("Slice", ["q", "mid", "end", "axis", "one"], ["second"]),
        helper.make_node("Neg", ["second"], ["negated"]),
        helper.make_node("Concat", ["negated", "first"], ["rotated"], axis=-1),
        helper.make_node("Mul", pair("q", "cos"), ["plain"]),
        helper.make_node("Mul", pair("rotated", "sin"), ["mixed"]),
        helper.make_node("Add", pair("plain", "mixed"), ["out"]),
    ]
    shapes = {"q": [1, HEADS, SEQ, DEPTH], "cos": [1, 1, SEQ, DEPTH], "sin": [1, 1, SEQ, DEPTH]}
    fed = {
        ("fed" if n == "q" and transposed else n): ([1, SEQ, HEADS, DEPTH] if n == "q" and transposed else s)
        for n, s in shapes.items()
    }
    graph = helper.make_graph(
        nodes,
        "rotary",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in fed.items()],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, shapes["q"])],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()


def _feeds(seed: int, transposed: bool = False) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    angles = np.outer(np.arange(SEQ), rng.random(DEPTH // 2)).astype(np.float32)
    angles = np.concatenate([angles, angles], axis=-1)[None, None]
    q = rng.standard_normal((1, HEADS, SEQ, DEPTH)).astype(np.float32)
    if transposed:
        return {"fed": q.transpose(0, 2, 1, 3).copy(), "cos": np.cos(angles), "sin": np.sin(angles)}
    return {"q": q, "cos": np.cos(angles), "sin": np.sin(angles)}


@pytest.mark.parametrize("swapped", [False, True])
def test_the_exported_rotation_is_one_gpuacc_layer_that_matches_onnxruntime(gpu, swapped):
    model = _rotary(swapped=swapped)
    opt = flowrt.optimize(flowrt.onnx.load(model), backends=["GpuAcc", "CpuRef"])
    kinds = [layer.kind for layer in opt.graph if layer.backend]
    assert kinds == ["ApplyRotary"] and {layer.backend for layer in opt.graph if layer.backend} == {"GpuAcc"}
    session = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
    feeds = [_feeds(seed) for seed in range(2)]
    for f, got in zip(feeds, lone_runs(opt, feeds), strict=True):
        np.testing.assert_allclose(got, session.run(None, f)[0], rtol=1e-5, atol=1e-6)


def test_a_split_other_than_the_half_is_left_as_it_is(gpu):
    model = _rotary(split=3)
    opt = flowrt.optimize(flowrt.onnx.load(model), backends=["GpuAcc", "CpuRef"])
    kinds = {layer.kind for layer in opt.graph if layer.backend}
    assert "ApplyRotary" not in kinds and {"Neg", "Concat"} <= kinds, kinds
    session = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
    (got,) = lone_runs(opt, [_feeds(0)])
    np.testing.assert_allclose(got, session.run(None, _feeds(0))[0], rtol=1e-5, atol=1e-6)


def test_the_heads_first_transpose_before_it_is_read_through_and_matches_onnxruntime(gpu):
    model = _rotary(transposed=True)
    opt = flowrt.optimize(flowrt.onnx.load(model), backends=["GpuAcc", "CpuRef"])
    (fused,) = [layer for layer in opt.graph if layer.backend]
    assert fused.kind == "ApplyRotary" and fused.descriptor.perm == (0, 2, 1, 3)
    session = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
    feeds = [_feeds(seed, transposed=True) for seed in range(2)]
    for f, got in zip(feeds, lone_runs(opt, feeds), strict=True):
        np.testing.assert_allclose(got, session.run(None, f)[0], rtol=1e-5, atol=1e-6)


def test_a_batching_stream_rotates_each_sample_by_its_own_angles_and_a_file_keeps_the_layer(gpu, tmp_path):
    opt = flowrt.optimize(flowrt.onnx.load(_rotary(transposed=True)), backends=["GpuAcc", "CpuRef"])
    flowrt.save(opt, tmp_path / "rotary.flowrt")
    again = flowrt.load(tmp_path / "rotary.flowrt")
    assert [(layer.kind, layer.descriptor.perm) for layer in again.graph if layer.backend] == [
        ("ApplyRotary", (0, 2, 1, 3))
    ]
    feeds = [_feeds(seed, transposed=True) for seed in range(4)]

    alone, batched, counts = alone_and_batched(again, feeds)
    assert counts[4] == 1  # the four ran as one batch of the re-batched network
    for a, b in zip(alone, batched, strict=True):
        np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(alone[0], lone_runs(opt, [feeds[0]])[0], rtol=0, atol=0)
