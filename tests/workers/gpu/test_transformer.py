"""A transformer encoder block as ONNX exports it, entirely on GpuAcc, and batched MatMul."""

import numpy as np
import onnx
import pytest
import trio
from fusedruns import cpuref_output, lone_runs
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

import flowrt
from flowrt.registry import FusedActivation

SEQ, HIDDEN, HEADS, FFN = 16, 64, 4, 128
HEAD = HIDDEN // HEADS


class _Graph:
    """An onnx graph under construction: nodes, and constants made initializers."""

    def __init__(self, seed: int = 0) -> None:
        self.rng = np.random.default_rng(seed)
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[onnx.TensorProto] = []

    def const(self, value) -> str:
        name = f"c{len(self.initializers)}"
        self.initializers.append(numpy_helper.from_array(np.asarray(value), name))
        return name

    def weight(self, *shape: int) -> str:
        return self.const((self.rng.standard_normal(shape) / np.sqrt(shape[0])).astype(np.float32))

    def op(self, kind: str, *inputs: str, **attributes) -> str:
        out = f"t{len(self.nodes)}"
        self.nodes.append(helper.make_node(kind, list(inputs), [out], **attributes))
        return out

    def linear(self, x: str, n_in: int, n_out: int) -> str:
        return self.op("Add", self.op("MatMul", x, self.weight(n_in, n_out)), self.weight(n_out))


def _attention(g: _Graph, h: str) -> str:
    def heads(x: str, perm) -> str:
        shaped = g.op("Reshape", x, g.const(np.array([1, SEQ, HEADS, HEAD], np.int64)))
        return g.op("Transpose", shaped, perm=perm)

    q = heads(g.linear(h, HIDDEN, HIDDEN), [0, 2, 1, 3])
    k = heads(g.linear(h, HIDDEN, HIDDEN), [0, 2, 3, 1])
    v = heads(g.linear(h, HIDDEN, HIDDEN), [0, 2, 1, 3])
    scores = g.op("Div", g.op("MatMul", q, k), g.const(np.float32(np.sqrt(HEAD))))
    context = g.op("MatMul", g.op("Softmax", scores, axis=-1), v)
    merged = g.op("Transpose", context, perm=[0, 2, 1, 3])
    return g.linear(g.op("Reshape", merged, g.const(np.array([1, SEQ, HIDDEN], np.int64))), HIDDEN, HIDDEN)


def _decomposed_layer_norm(g: _Graph, x: str) -> str:
    """LayerNormalization as older exporters write it: ReduceMean, Sub, Pow, Sqrt, Div."""
    centered = g.op("Sub", x, g.op("ReduceMean", x, axes=[-1]))
    variance = g.op("ReduceMean", g.op("Pow", centered, g.const(np.float32(2.0))), axes=[-1])
    std = g.op("Sqrt", g.op("Add", variance, g.const(np.float32(1e-5))))
    return g.op("Add", g.op("Mul", g.op("Div", centered, std), g.weight(HIDDEN)), g.weight(HIDDEN))


def _feed_forward(g: _Graph, h: str) -> str:
    up = g.linear(h, HIDDEN, FFN)
    erf = g.op("Erf", g.op("Div", up, g.const(np.float32(np.sqrt(2.0)))))
    gelu = g.op("Mul", g.op("Mul", up, g.op("Add", erf, g.const(np.float32(1.0)))), g.const(np.float32(0.5)))
    return g.linear(gelu, FFN, HIDDEN)


def encoder_block() -> onnx.ModelProto:
    """x (1, SEQ, HIDDEN) -> pre-norm self-attention and a Gelu feed-forward, both residual."""
    g = _Graph()
    h = g.op("LayerNormalization", "x", g.weight(HIDDEN), g.weight(HIDDEN), axis=-1, epsilon=1e-5)
    attended = g.op("Add", "x", _attention(g, h))
    g.op("Add", attended, _feed_forward(g, _decomposed_layer_norm(g, attended)))
    g.nodes[-1].output[0] = "y"  # the block's last Add writes the graph output
    graph = helper.make_graph(
        g.nodes,
        "encoder_block",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, SEQ, HIDDEN])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, SEQ, HIDDEN])],
        g.initializers,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


async def _run(model: onnx.ModelProto, backends, x, half=False):
    options = flowrt.OptimizerOptions(reduce_fp32_to_fp16=half)
    opt = flowrt.optimize(flowrt.onnx.load(model), backends=backends, options=options)
    async with flowrt.Runtime(cpu_workers=1) as rt:
        loaded = await rt.load(opt, max_in_flight=1)
        return opt, (await loaded.run({"x": x}))["y"]


@pytest.mark.parametrize("half", [False, True])
def test_encoder_block_runs_entirely_on_gpuacc_in_fused_layers_and_matches_cpuref(gpu, half):
    """Each Linear (MatMul + Add) is one MatMulBias, the feed-forward's Gelu (written out
    with Erf) is applied in the first one's epilogue, the LayerNormalization written out of
    ReduceMean, Pow and Sqrt is one layer, the attention's scale (a Div) and Softmax are one
    AttentionSoftmax, its products read the head splits in place and P V writes the heads'
    merge (TransposedMatMul); in float16 too (reduce_fp32_to_fp16)."""
    model = encoder_block()
    x = np.random.default_rng(1).standard_normal((1, SEQ, HIDDEN)).astype(np.float32)
    opt, got = trio.run(_run, model, ["GpuAcc", "CpuRef"], x, half)
    layers = [layer for layer in opt.graph if layer.backend]
    kinds = {layer.kind for layer in layers}
    assert {"MatMulBias", "TransposedMatMul", "AttentionSoftmax", "LayerNormalization"} <= kinds
    assert not kinds & {"Erf", "ReduceMean", "Pow", "Sqrt", "Div", "Softmax", "MatMul", "Transpose"}, kinds
    merged = [layer for layer in layers if layer.kind == "TransposedMatMul" and layer.descriptor.perm_y]
    assert [layer.descriptor.perm_y for layer in merged] == [(0, 2, 1, 3)]  # the heads' merge
    linears = [layer for layer in layers if layer.kind == "MatMulBias"]
    assert len(linears) == 6 and [layer.activation.kind for layer in linears if layer.activation] == ["Gelu"]
    assert set(opt.assignments().values()) == {"GpuAcc"}, opt.assignments()
    if half:
        assert {layer.outputs[0].info.dtype for layer in linears} == {flowrt.types.DataType.FLOAT16}
    _, expected = trio.run(_run, model, ["CpuRef"], x)
    tolerance = 1e-2 * float(np.abs(expected).max()) if half else 1e-4
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=tolerance)


@st.composite
def batched_shapes(draw):
    m, k, n = (draw(st.integers(1, 70)) for _ in range(3))
    batch = tuple(draw(st.lists(st.integers(1, 3), max_size=2)))
    side = draw(st.sampled_from(["both", "a", "b", "vector_a", "vector_b"]))
    a = {
        "both": (*batch, m, k),
        "a": (*batch, m, k),
        "b": (m, k),
        "vector_a": (k,),
        "vector_b": (*batch, m, k),
    }
    b = {
        "both": (*batch, k, n),
        "a": (k, n),
        "b": (*batch, k, n),
        "vector_a": (*batch, k, n),
        "vector_b": (k,),
    }
    return a[side], b[side], draw(st.integers(0, 2**31))


@settings(max_examples=20, deadline=None)
@given(case=batched_shapes())
def test_batched_matmul_matches_cpuref(run_both, case):
    a_shape, b_shape, seed = case
    rng = np.random.default_rng(seed)
    a, b = rng.standard_normal(a_shape).astype(np.float32), rng.standard_normal(b_shape).astype(np.float32)
    (got,), (expected,) = run_both("MatMul", flowrt.descriptors.MatMul(), [a, b])
    assert got.shape == expected.shape
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize(("a", "b"), [((2, 1, 4, 5), (1, 3, 5, 6)), ((2, 4, 5), (3, 1, 5, 6))])
def test_matmul_with_crossed_batch_broadcasting_is_declined(gpu, a, b):
    from flowrt.types import TensorInfo
    from flowrt.workers.gpu.layer_support import GpuLayerSupport

    out = TensorInfo(np.broadcast_shapes(a[:-2], b[:-2]) + (a[-2], b[-1]))
    answer = GpuLayerSupport().is_layer_supported(
        "MatMul", flowrt.descriptors.MatMul(), [TensorInfo(a), TensorInfo(b)], [out]
    )
    assert not answer.supported and "batch dims" in answer.reason


def test_gpt2s_tanh_gelu_is_applied_in_the_feed_forwards_gemm(gpu):
    """GPT-2's feed-forward: MatMul + bias Add + Gelu in its tanh form is one MatMulBias that
    applies that form as it writes (common.cl's ACT_GELU_TANH), matching CpuRef."""
    rng = np.random.default_rng(6)
    net = flowrt.Network()
    x = net.add_input("x", flowrt.types.TensorInfo((2, SEQ, HIDDEN)))
    w = rng.standard_normal((HIDDEN, 4 * HIDDEN)).astype(np.float32) * 0.3
    b = rng.standard_normal(4 * HIDDEN).astype(np.float32)
    product = net.add_layer("MatMul", inputs=[x, w], name="fc")
    biased = net.add_layer("Add", inputs=[product, b], name="bias")
    net.add_output("out", net.add_layer("Gelu", flowrt.descriptors.Gelu("tanh"), [biased], name="gelu"))
    opt = flowrt.optimize(net, backends=["GpuAcc", "CpuRef"])
    (linear,) = [layer for layer in opt.graph if layer.backend]
    assert linear.kind == "MatMulBias" and linear.backend == "GpuAcc"
    assert linear.activation == FusedActivation("Gelu", form="tanh")
    feeds = {"x": rng.standard_normal((2, SEQ, HIDDEN)).astype(np.float32)}
    (got,) = lone_runs(opt, [feeds])
    np.testing.assert_allclose(got, cpuref_output(net, feeds), rtol=1e-4, atol=1e-4)
