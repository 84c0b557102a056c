"""Attention's head splits read in place: a MatMul of Transposes as one TransposedMatMul on
GpuAcc, its operands read through permuted strides in two levels of batch steps, and the
Transpose after it (the heads' merge) written by it through the strides of the result. The
layouts, the kernel against CpuRef, and the fusion through the public API against ONNX
Runtime, batched and saved."""

import numpy as np
import onnxruntime as ort
import pytest
import trio
from fusedruns import alone_and_batched, lone_runs, sequence_model
from onnx import TensorProto, helper, numpy_helper

import flowrt
from flowrt.errors import ShapeError
from flowrt.types import TensorInfo
from flowrt.workers.cpu.ref.kernels import load_all as ref_kernels
from flowrt.workers.gpu.kernels.matmul import transposed_layout, written_layout

SEQ, HEADS, DEPTH = 10, 3, 4
WIDTH = HEADS * DEPTH
SPLIT, KEYS = (0, 2, 1, 3), (0, 2, 3, 1)  # (batch, seq, heads, depth) -> heads first; K^T
MERGE = SPLIT  # (batch, heads, seq, depth) -> (batch, seq, heads, depth): its own inverse


def test_the_layout_reads_head_splits_in_two_levels_of_batch_steps():
    # Q K^T of one sample: the heads are one run of steps (DEPTH apart), rows WIDTH apart.
    (plan, a, b) = transposed_layout((1, SEQ, HEADS, DEPTH), SPLIT, (1, SEQ, HEADS, DEPTH), KEYS)
    assert plan == (SEQ, SEQ, DEPTH, HEADS, HEADS)
    assert a == (WIDTH, 1, DEPTH, 1, 0) and b == (1, WIDTH, DEPTH, 1, 0)
    # Two samples: the samples' run (SEQ * WIDTH apart) outside the heads' run.
    (plan, a, b) = transposed_layout((2, SEQ, HEADS, DEPTH), SPLIT, (2, HEADS, SEQ, DEPTH), None)
    assert plan == (SEQ, DEPTH, DEPTH, 2 * HEADS, 2 * HEADS)
    assert a == (WIDTH, 1, SEQ * WIDTH, HEADS, DEPTH) and b == (DEPTH, 1, SEQ * DEPTH, 1, 0)
    # A's batch folds into its rows where B has none, where the rows make one run of strides;
    # A transposed by (1, 0, 2) has rows 6 and 24 apart, which do not.
    assert transposed_layout((4, 5, 6), None, (7, 6), (1, 0)) == (
        (20, 7, 6, 1, 1),
        (6, 1, 0, 1, 0),
        (1, 6, 0, 1, 0),
    )
    why = transposed_layout((5, 4, 6), (1, 0, 2), (6, 7), None)
    assert why == "A's batch dims and rows [4, 5] in one run of strides, read with [6, 24]"
    why = transposed_layout((2, 3, 4, 5, 6), (1, 0, 2, 3, 4), (2, 3, 4, 6, 5), (1, 0, 2, 3, 4))
    assert isinstance(why, str) and "at most two runs" in why


def test_the_layout_writes_the_merged_heads_in_two_levels_of_batch_steps():
    # P V of two samples, (2, HEADS, SEQ, DEPTH), written as (2, SEQ, HEADS, DEPTH): rows WIDTH
    # apart, the samples' run SEQ * WIDTH apart outside the heads' run DEPTH apart.
    shapes = ((2, HEADS, SEQ, SEQ), None, (2, SEQ, HEADS, DEPTH), SPLIT)
    assert written_layout(*shapes, MERGE) == (WIDTH, 1, SEQ * WIDTH, HEADS, DEPTH)
    # One batch, A's rows folded: (4, 5) @ (5, 6) written transposed, columns 4 apart.
    assert written_layout((4, 5), None, (5, 6), None, (1, 0)) == (1, 4, 0, 1, 0)
    # A's batch folded into its rows, written with the batch last: the rows make two runs.
    why = written_layout((2, 3, 4), None, (4, 5), None, (1, 2, 0))
    assert why == "the product's batch dims and rows [2, 3] in one run of strides, written with [1, 10]"
    why = written_layout((2, 3, 4, 5, 6), None, (2, 3, 4, 6, 5), None, (1, 3, 0, 4, 2))
    assert isinstance(why, str) and "at most two runs" in why


def test_cpuref_multiplies_the_operands_as_transposed():
    rng = np.random.default_rng(2)
    a, b = rng.standard_normal((2, SEQ, HEADS, DEPTH)), rng.standard_normal((2, SEQ, HEADS, DEPTH))
    desc = flowrt.descriptors.TransposedMatMul(perm_a=SPLIT, perm_b=KEYS, alpha=0.5)
    got = ref_kernels()["TransposedMatMul"](desc, a, b)
    np.testing.assert_allclose(got, 0.5 * np.transpose(a, SPLIT) @ np.transpose(b, KEYS), rtol=1e-12)
    desc = flowrt.descriptors.TransposedMatMul(perm_a=SPLIT, perm_b=KEYS, perm_y=MERGE)
    got = ref_kernels()["TransposedMatMul"](desc, a, b)
    want = np.transpose(np.transpose(a, SPLIT) @ np.transpose(b, KEYS), MERGE)
    assert got.flags.c_contiguous and got.shape == (2, SEQ, HEADS, SEQ)
    np.testing.assert_allclose(got, want, rtol=1e-12)


def _run_layer(run, a_shape, perm_a, b_shape, perm_b, perm_y=None, seed=0):
    rng = np.random.default_rng(seed)
    a, b = (rng.standard_normal(s).astype(np.float32) for s in (a_shape, b_shape))
    desc = flowrt.descriptors.TransposedMatMul(perm_a=perm_a, perm_b=perm_b, perm_y=perm_y)
    (got,), (expected,) = run("TransposedMatMul", desc, [a, b])
    return got, expected


CASES = {
    "scores": ((1, SEQ, HEADS, DEPTH), SPLIT, (1, SEQ, HEADS, DEPTH), KEYS),
    "scores_batch3": ((3, SEQ, HEADS, DEPTH), SPLIT, (3, SEQ, HEADS, DEPTH), KEYS),
    "context_batch2": ((2, HEADS, SEQ, SEQ), None, (2, SEQ, HEADS, DEPTH), SPLIT),
    "a_only": ((SEQ, 2, DEPTH), (1, 0, 2), (2, DEPTH, 5), None),
    "rows_folded": ((4, 5, 6), None, (6, 7), (0, 1)),
    "b_transposed": ((SEQ, 6), None, (7, 6), (1, 0)),
    "context_merged": ((1, HEADS, SEQ, SEQ), None, (1, SEQ, HEADS, DEPTH), SPLIT, MERGE),
    "context_merged_batch2": ((2, HEADS, SEQ, SEQ), None, (2, SEQ, HEADS, DEPTH), SPLIT, MERGE),
    "rows_folded_transposed": ((4, 5, 6), None, (6, 7), None, (2, 0, 1)),
    "plain_product_transposed": ((3, SEQ, 6), None, (3, 6, 7), None, (2, 1, 0)),
}


@pytest.mark.parametrize("case", CASES)
def test_the_kernel_matches_cpuref(run_both, case):
    got, expected = _run_layer(run_both, *CASES[case])
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("case", ["scores_batch3", "context_merged_batch2"])
def test_the_kernel_stores_half(run_half, case):
    got, expected = _run_layer(run_half, *CASES[case], seed=1)
    np.testing.assert_allclose(got, expected, rtol=1e-2, atol=2e-2)


def test_a_perm_that_is_not_one_is_a_shape_error():
    net = flowrt.Network()
    a, b = net.add_input("a", TensorInfo((2, 3, 4))), net.add_input("b", TensorInfo((2, 4, 5)))
    desc = flowrt.descriptors.TransposedMatMul(perm_a=(0, 0, 1))
    net.add_output("y", net.add_layer("TransposedMatMul", desc, [a, b]))
    with pytest.raises(ShapeError, match=r"perm_a expects a permutation of 0\.\.2, got \[0, 0, 1\]"):
        flowrt.optimize(net, backends=["CpuRef"])
    net = flowrt.Network()
    a, b = net.add_input("a", TensorInfo((2, 3, 4))), net.add_input("b", TensorInfo((2, 4, 5)))
    desc = flowrt.descriptors.TransposedMatMul(perm_y=(0, 1))
    net.add_output("y", net.add_layer("TransposedMatMul", desc, [a, b]))
    with pytest.raises(ShapeError, match=r"perm_y expects a permutation of 0\.\.2, got \[0, 1\]"):
        flowrt.optimize(net, backends=["CpuRef"])


def _attention() -> bytes:
    """x (1, seq, width) -> multi-head self-attention as exporters write it: projections,
    Reshape to heads, Transpose, Q K^T / sqrt(depth), Softmax, P V, Transpose back, Reshape."""
    rng = np.random.default_rng(0)
    inits = {f"w{n}": rng.standard_normal((WIDTH, WIDTH)).astype(np.float32) * 0.3 for n in "qkv"}
    inits["heads"] = np.array([1, SEQ, HEADS, DEPTH], np.int64)
    inits["merged"] = np.array([1, SEQ, WIDTH], np.int64)
    inits["root"] = np.float32(np.sqrt(DEPTH))
    nodes = []
    for n, perm in (("q", SPLIT), ("k", KEYS), ("v", SPLIT)):
        nodes += [
            helper.make_node("MatMul", ["x", f"w{n}"], [f"{n}p"]),
            helper.make_node("Reshape", [f"{n}p", "heads"], [f"{n}r"]),
            helper.make_node("Transpose", [f"{n}r"], [f"{n}t"], perm=list(perm)),
        ]
    nodes += [
        helper.make_node("MatMul", ["qt", "kt"], ["s"]),
        helper.make_node("Div", ["s", "root"], ["scaled"]),
        helper.make_node("Softmax", ["scaled"], ["p"], axis=-1),
        helper.make_node("MatMul", ["p", "vt"], ["c"]),
        helper.make_node("Transpose", ["c"], ["ct"], perm=[0, 2, 1, 3]),
        helper.make_node("Reshape", ["ct", "merged"], ["out"]),
    ]
    return sequence_model(nodes, inits, SEQ, WIDTH, "attention")


def _feeds(seed: int) -> dict[str, np.ndarray]:
    return {"x": np.random.default_rng(seed).standard_normal((1, SEQ, WIDTH)).astype(np.float32)}


def test_head_splits_and_merge_take_no_transpose_and_match_onnxruntime(gpu):
    model = _attention()
    opt = flowrt.optimize(flowrt.onnx.load(model), backends=["GpuAcc", "CpuRef"])
    products = [layer for layer in opt.graph if layer.kind == "TransposedMatMul"]
    perms = [(p.descriptor.perm_a, p.descriptor.perm_b, p.descriptor.perm_y) for p in products]
    assert perms == [(SPLIT, KEYS, None), (None, SPLIT, MERGE)]
    assert {p.backend for p in products} == {"GpuAcc"}
    # P V writes the merged heads itself; the projections stay MatMuls.
    assert not [layer for layer in opt.graph if layer.kind == "Transpose"]
    session = ort.InferenceSession(model, providers=["CPUExecutionProvider"])

    for seed, got in enumerate(lone_runs(opt, [_feeds(seed) for seed in range(3)])):
        np.testing.assert_allclose(got, session.run(None, _feeds(seed))[0], rtol=1e-5, atol=1e-5)


def test_a_batching_stream_reads_each_samples_heads_in_two_levels_of_steps(gpu):
    opt = flowrt.optimize(flowrt.onnx.load(_attention()), backends=["GpuAcc", "CpuRef"])
    feeds = [_feeds(seed) for seed in range(4)]

    alone, batched, counts = alone_and_batched(opt, feeds)
    assert counts[4] == 1  # the four ran as one batch of the re-batched network
    for a, b in zip(alone, batched, strict=True):
        np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-5)


def test_the_fused_layer_round_trips_through_a_flowrt_file(gpu, tmp_path):
    opt = flowrt.optimize(flowrt.onnx.load(_attention()), backends=["GpuAcc", "CpuRef"])
    flowrt.save(opt, tmp_path / "attention.flowrt")
    again = flowrt.load(tmp_path / "attention.flowrt")
    products = [layer for layer in again.graph if layer.kind == "TransposedMatMul"]
    assert [(p.descriptor.perm_b, p.descriptor.perm_y) for p in products] == [(KEYS, None), (SPLIT, MERGE)]

    async def main():
        async with flowrt.Runtime(cpu_workers=1) as rt:
            return [(await (await rt.load(o)).run(_feeds(5)))["out"] for o in (opt, again)]

    first, second = trio.run(main)
    np.testing.assert_array_equal(first, second)


def test_a_transpose_before_constant_weights_is_left_to_the_bias_fusion(gpu):
    net = flowrt.Network()
    x = net.add_input("x", TensorInfo((SEQ, 1, WIDTH)))
    t = net.add_layer("Transpose", flowrt.descriptors.Transpose(perm=(1, 0, 2)), [x])
    w = np.ones((WIDTH, 5), np.float32)
    product = net.add_layer("MatMul", None, [t, w])
    net.add_output("y", net.add_layer("Add", None, [product, np.zeros(5, np.float32)]))
    opt = flowrt.optimize(net, backends=["GpuAcc", "CpuRef"])
    kinds = sorted(layer.kind for layer in opt.graph if layer.backend)
    assert "TransposedMatMul" not in kinds and "MatMulBias" in kinds, kinds


def _scaled_scores(shared: bool) -> bytes:
    """q and k (1, heads, seq, depth) each scaled by depth ** -0.25 before q @ k^T, as
    torchvision's ViT writes it; ``shared``: the scaled q is an output too."""
    inits = [numpy_helper.from_array(np.float32(DEPTH**-0.25), "s")]
    nodes = [
        helper.make_node("Mul", ["q", "s"], ["qs"]),
        helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 1, 3, 2]),
        helper.make_node("Mul", ["kt", "s"], ["ks"]),
        helper.make_node("MatMul", ["qs", "ks"], ["scores"]),
    ]
    dims = [1, HEADS, SEQ, DEPTH]
    outputs = [helper.make_tensor_value_info("scores", TensorProto.FLOAT, [1, HEADS, SEQ, SEQ])]
    if shared:
        outputs.append(helper.make_tensor_value_info("qs", TensorProto.FLOAT, dims))
    graph = helper.make_graph(
        nodes,
        "scores",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, dims) for n in "qk"],
        outputs,
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()


@pytest.mark.parametrize("shared", [False, True])
def test_scales_of_the_operands_become_the_products_alpha_and_match_onnxruntime(gpu, shared):
    model = _scaled_scores(shared)
    opt = flowrt.optimize(flowrt.onnx.load(model), backends=["GpuAcc", "CpuRef"])
    (product,) = [layer for layer in opt.graph if layer.kind == "TransposedMatMul"]
    muls = [layer for layer in opt.graph if layer.kind == "Mul"]
    if shared:  # q's scale stays a layer of its own, read by the output: only k's is folded
        assert len(muls) == 1 and product.descriptor.alpha == pytest.approx(DEPTH**-0.25)
    else:
        assert not muls and product.descriptor.alpha == pytest.approx(DEPTH**-0.5)
    assert product.descriptor.perm_b == (0, 1, 3, 2)
    rng = np.random.default_rng(3)
    feeds = {n: rng.standard_normal((1, HEADS, SEQ, DEPTH)).astype(np.float32) for n in "qk"}
    expected = ort.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, feeds)

    async def main():
        async with flowrt.Runtime(cpu_workers=1) as rt:
            return await (await rt.load(opt)).run(feeds)

    got = trio.run(main)
    np.testing.assert_allclose(got["scores"], expected[0], rtol=1e-5, atol=1e-5)
    if shared:
        np.testing.assert_allclose(got["qs"], expected[1], rtol=1e-6)
