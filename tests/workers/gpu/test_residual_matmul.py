"""A transformer's residual connection (MatMul [+ bias] + Add of a tensor of the product's
shape) as one MatMulBias with Z on GpuAcc, added in the GEMM's epilogue: fused through the
optimizer, run and batched through the public API, against ONNX Runtime and CpuRef."""

import numpy as np
import onnxruntime as ort
import pytest
import trio
from fusedruns import alone_and_batched, lone_runs, sequence_model
from onnx import helper

import flowrt
from flowrt.errors import ShapeError
from flowrt.registry import WorkloadInfo
from flowrt.types import TensorInfo
from flowrt.workers.cpu.acc.kernels.gemm import MatMulBiasKernel as AccMatMulBias
from flowrt.workers.cpu.ref.kernels import load_all as ref_kernels

SEQ, WIDTH = 16, 32


def _block(with_bias: bool, then_norm: bool) -> bytes:
    """x -> MatMul(W) [+ b] -> + x [-> LayerNormalization]: a post-norm encoder's output
    projection (BERT) or, without bias and norm, a pre-norm decoder's (LLaMA)."""
    rng = np.random.default_rng(0)
    inits = {"w": rng.standard_normal((WIDTH, WIDTH)).astype(np.float32) * 0.2}
    nodes = [helper.make_node("MatMul", ["x", "w"], ["p"])]
    product = "p"
    if with_bias:
        inits["b"] = rng.standard_normal(WIDTH).astype(np.float32)
        nodes.append(helper.make_node("Add", ["p", "b"], ["pb"]))
        product = "pb"
    nodes.append(helper.make_node("Add", [product, "x"], ["r"]))
    out = "r"
    if then_norm:
        inits["g"] = np.linspace(0.5, 1.5, WIDTH, dtype=np.float32)
        nodes.append(helper.make_node("LayerNormalization", ["r", "g"], ["y"], axis=-1))
        out = "y"
    nodes.append(helper.make_node("Identity", [out], ["out"]))
    return sequence_model(nodes, inits, SEQ, WIDTH, "block")


def _feeds(seed: int) -> dict[str, np.ndarray]:
    return {"x": np.random.default_rng(seed).standard_normal((1, SEQ, WIDTH)).astype(np.float32)}


@pytest.mark.parametrize(("with_bias", "then_norm"), [(True, True), (False, False)], ids=["bert", "llama"])
def test_residual_add_is_one_matmul_bias_on_gpuacc_and_matches_onnxruntime(gpu, with_bias, then_norm):
    model = _block(with_bias, then_norm)
    opt = flowrt.optimize(flowrt.onnx.load(model), backends=["GpuAcc", "CpuRef"])
    (fused,) = [layer for layer in opt.graph if layer.kind == "MatMulBias"]
    assert fused.backend == "GpuAcc" and len(fused.inputs) == 4
    assert (fused.inputs[2].source is not None) == with_bias  # the bias absent after a bare MatMul
    assert not [layer for layer in opt.graph if layer.kind == "Add"]  # bias and residual both inside
    session = ort.InferenceSession(model, providers=["CPUExecutionProvider"])

    for seed, got in enumerate(lone_runs(opt, [_feeds(seed) for seed in range(3)])):
        np.testing.assert_allclose(got, session.run(None, _feeds(seed))[0], rtol=1e-5, atol=1e-5)


def test_a_batching_stream_batches_the_fused_layer_each_sample_its_own_residual(gpu):
    opt = flowrt.optimize(flowrt.onnx.load(_block(True, True)), backends=["GpuAcc", "CpuRef"])
    feeds = [_feeds(seed) for seed in range(4)]

    alone, batched, counts = alone_and_batched(opt, feeds)
    assert counts[4] == 1  # the four ran as one batch of the re-batched network
    for a, b in zip(alone, batched, strict=True):
        np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-6)


def test_cpuref_adds_bias_and_residual_and_either_may_be_absent():
    rng = np.random.default_rng(1)
    a, b = rng.standard_normal((2, 3, 4)), rng.standard_normal((4, 5))
    bias, z = rng.standard_normal(5), rng.standard_normal((2, 3, 5))
    kernel = ref_kernels()["MatMulBias"]
    np.testing.assert_allclose(kernel(None, a, b, bias, z), a @ b + bias + z)
    np.testing.assert_allclose(kernel(None, a, b, None, z), a @ b + z)
    np.testing.assert_allclose(kernel(None, a, b, bias), a @ b + bias)


def test_a_residual_of_another_shape_is_a_shape_error_and_cpuacc_leaves_z_to_others():
    net = flowrt.Network()
    x = net.add_input("x", TensorInfo((2, 3, 4)))
    w, bias = np.ones((4, 5), np.float32), np.zeros(5, np.float32)
    z = net.add_input("z", TensorInfo((2, 3, 4)))
    net.add_output("y", net.add_layer("MatMulBias", None, [x, w, bias, z]))
    with pytest.raises(ShapeError, match=r"MatMulBias expects Z of its output's shape \(2, 3, 5\)"):
        flowrt.optimize(net, backends=["CpuRef"])
    infos = (TensorInfo((2, 3, 4)), TensorInfo((4, 5)), None, TensorInfo((2, 3, 5)))
    answer = AccMatMulBias.supports(WorkloadInfo("m", "MatMulBias", None, infos, (TensorInfo((2, 3, 5)),)))
    assert not answer.supported and "no residual Z" in answer.reason


def test_the_fused_layer_round_trips_through_a_flowrt_file(gpu, tmp_path):
    opt = flowrt.optimize(flowrt.onnx.load(_block(False, False)), backends=["GpuAcc", "CpuRef"])
    flowrt.save(opt, tmp_path / "block.flowrt")
    again = flowrt.load(tmp_path / "block.flowrt")
    (fused,) = [layer for layer in again.graph if layer.kind == "MatMulBias"]
    assert fused.inputs[2].source is None and fused.inputs[3].source is not None

    async def main():
        async with flowrt.Runtime(cpu_workers=1) as rt:
            return [(await (await rt.load(o)).run(_feeds(2)))["out"] for o in (opt, again)]

    first, second = trio.run(main)
    np.testing.assert_array_equal(first, second)


def _conv1d_block(then: str) -> bytes:
    """GPT-2's Conv1D as exported: x (1, seq, width) -> Reshape to rows -> Gemm (W, b) ->
    Reshape back, then + x (``residual``) or Relu (``relu``)."""
    rng = np.random.default_rng(4)
    inits = {
        "w": rng.standard_normal((WIDTH, WIDTH)).astype(np.float32) * 0.2,
        "b": rng.standard_normal(WIDTH).astype(np.float32),
        "rows": np.array([-1, WIDTH], np.int64),
        "back": np.array([1, SEQ, WIDTH], np.int64),
    }
    nodes = [
        helper.make_node("Reshape", ["x", "rows"], ["r"]),
        helper.make_node("Gemm", ["r", "w", "b"], ["g"]),
        helper.make_node("Reshape", ["g", "back"], ["p"]),
        helper.make_node("Add", ["p", "x"], ["out"])
        if then == "residual"
        else helper.make_node("Relu", ["p"], ["out"]),
    ]
    return sequence_model(nodes, inits, SEQ, WIDTH, "conv1d")


@pytest.mark.parametrize("then", ["residual", "relu"])
def test_a_gemm_on_a_sequences_rows_is_one_matmul_bias_with_what_follows_it(gpu, then):
    model = _conv1d_block(then)
    opt = flowrt.optimize(flowrt.onnx.load(model), backends=["GpuAcc", "CpuRef"])
    layers = [layer for layer in opt.graph if layer.backend]
    assert [layer.kind for layer in layers] == ["MatMulBias"] and layers[0].backend == "GpuAcc"
    (fused,) = layers
    assert (len(fused.inputs) > 3 and fused.inputs[3].source is not None) == (then == "residual")
    assert (fused.activation is not None and fused.activation.kind == "Relu") == (then == "relu")
    session = ort.InferenceSession(model, providers=["CPUExecutionProvider"])

    for seed, got in enumerate(lone_runs(opt, [_feeds(seed) for seed in range(2)])):
        np.testing.assert_allclose(got, session.run(None, _feeds(seed))[0], rtol=1e-5, atol=1e-5)
