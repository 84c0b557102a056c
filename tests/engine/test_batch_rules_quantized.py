"""Re-batching of quantized networks (``batch_rules_quantized``): a QDQ network folded into
QLinearConv, QLinearAdd and QGemm on CpuAcc, or run as
QuantizeLinear and DequantizeLinear on CpuRef, runs N samples as N runs of one; what would mix
samples is refused with the reason."""

import numpy as np
import onnx
import pytest
import trio
from onnx import TensorProto, helper
from qdqmodels import _quantize, _weights

import flowrt
from flowrt.engine.graph.layer_kind import known_layer_kinds
from flowrt.engine.graph.passes import fold_qdq
from flowrt.engine.graph.passes.batch_rules import RULES
from flowrt.errors import ShapeError
from flowrt.types import TensorInfo

BATCH = 3


def _residual_qdq_model(path) -> str:
    """x (1, 8, 10, 10) -> QDQ -> Conv 3x3 -> QDQ -> Add x -> QDQ -> GlobalAveragePool ->
    Flatten -> QDQ -> Gemm -> QDQ -> y (1, 6): a residual block and a classifier, as
    quantize_static writes them."""
    rng = np.random.default_rng(31)
    nodes: list = []
    inits: list = []
    _quantize(nodes, inits, "x", 0.02, 128, "xq")
    w = rng.standard_normal((8, 8, 3, 3)).astype(np.float32) * 0.2
    _weights(nodes, inits, "w", w, 0, rng, True)
    nodes.append(helper.make_node("Conv", ["xq", "w"], ["c"], pads=[1] * 4, name="conv"))
    _quantize(nodes, inits, "c", 0.03, 128, "rq")
    nodes.append(helper.make_node("Add", ["rq", "xq"], ["s"], name="add"))
    _quantize(nodes, inits, "s", 0.04, 110, "sq")
    nodes.append(helper.make_node("GlobalAveragePool", ["sq"], ["p"]))
    nodes.append(helper.make_node("Flatten", ["p"], ["pf"]))
    _quantize(nodes, inits, "pf", 0.01, 120, "f")
    g = rng.standard_normal((6, 8)).astype(np.float32) * 0.3
    _weights(nodes, inits, "g", g, 0, rng, True)
    nodes.append(helper.make_node("Gemm", ["f", "g"], ["o"], transB=1, name="gemm"))
    _quantize(nodes, inits, "o", 0.02, 128, "y")
    graph = helper.make_graph(
        nodes,
        "residual_qdq",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 10, 10])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 6])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return str(path)


@pytest.mark.parametrize(
    "backends, kinds",
    [
        (["CpuAcc", "CpuRef"], {"QLinearConv", "QLinearAdd", "QGemm"}),
        (["CpuRef"], {"QuantizeLinear", "DequantizeLinear"}),
    ],
)
def test_a_quantized_network_runs_a_batch_as_runs_of_one(tmp_path, backends, kinds):
    opt = flowrt.optimize(flowrt.onnx.load(_residual_qdq_model(tmp_path / "q.onnx")), backends=backends)
    assert kinds <= {layer.kind for layer in opt.graph}
    assert flowrt.set_batch(opt, BATCH).graph.output_layers[0].input_infos[0].shape == (BATCH, 6)
    x = np.random.default_rng(32).standard_normal((BATCH, 8, 10, 10)).astype(np.float32)

    async def run():
        async with flowrt.Runtime(cpu_workers=2) as rt:
            one, many = await rt.load(opt), await rt.load(opt, batch=BATCH)
            got = (await many.run({"x": x}))["y"]
            return got, [(await one.run({"x": x[i : i + 1]}))["y"] for i in range(BATCH)]

    got, each = trio.run(run)
    assert got.shape == (BATCH, 6) and len({tuple(e.ravel()) for e in each}) == BATCH
    np.testing.assert_allclose(got, np.concatenate(each), rtol=1e-6, atol=1e-6)


def test_a_batching_stream_of_a_quantized_network_runs_batches(tmp_path):
    """Requests sent together to a stream of the QDQ network on CpuAcc leave in batches of
    more than one (before its layers had rules, each ran alone), each with its own result."""
    opt = flowrt.optimize(
        flowrt.onnx.load(_residual_qdq_model(tmp_path / "q.onnx")), backends=["CpuAcc", "CpuRef"]
    )
    rng = np.random.default_rng(33)
    images = [rng.standard_normal((1, 8, 10, 10)).astype(np.float32) for _ in range(8)]

    async def run():
        async with flowrt.Runtime(cpu_workers=2) as rt:
            model = await rt.load(opt, max_in_flight=1)
            expected = [(await model.run({"x": x}))["y"] for x in images]
            async with model.stream(max_batch=4, max_delay=0.05) as s:

                async def produce():
                    for x in images:
                        await s.send({"x": x})
                    s.close()

                async with trio.open_nursery() as nursery:
                    nursery.start_soon(produce)
                    got = [outputs["y"] async for outputs in s]
                return expected, got, dict(s.batch_counts)

    expected, got, counts = trio.run(run)
    assert max(counts) > 1 and sum(size * n for size, n in counts.items()) == len(images)
    for g, e in zip(got, expected, strict=True):
        np.testing.assert_allclose(g, e, rtol=1e-6, atol=1e-6)


def _quantize_network(axis: int, scale_shape: tuple[int, ...]) -> flowrt.Network:
    net = flowrt.Network()
    x = net.add_input("x", TensorInfo((1, 4, 5)))
    scale = np.full(scale_shape, 0.1, np.float32)
    zero = np.zeros(scale_shape, np.uint8)
    q = net.add_layer(
        "QuantizeLinear", flowrt.descriptors.QuantizeLinear(axis=axis), [x, scale, zero], name="q"
    )
    net.add_output("y", q)
    return net


def test_per_axis_scales_along_another_axis_re_batch():
    net = flowrt.set_batch(_quantize_network(1, (4,)), BATCH)
    assert net.graph.output_layers[0].input_infos[0].shape == (BATCH, 4, 5)


def test_blocked_scales_are_refused():
    net = flowrt.Network()
    x = net.add_input("x", TensorInfo((1, 4, 5)))
    scale = np.full((1, 2, 5), 0.1, np.float32)
    q = net.add_layer(
        "QuantizeLinear", flowrt.descriptors.QuantizeLinear(axis=1, block_size=2), [x, scale], name="q"
    )
    net.add_output("y", q)
    with pytest.raises(ShapeError, match="per block"):
        flowrt.set_batch(net, BATCH)


def test_a_dynamic_quantization_is_refused():
    net = flowrt.Network()
    x = net.add_input("x", TensorInfo((1, 6)))
    dq = net.add_layer("DynamicQuantizeLinear", None, [x], name="dq", num_outputs=3)
    net.add_output("y", dq)
    with pytest.raises(ShapeError, match="computed over the whole tensor"):
        flowrt.set_batch(net, BATCH)


def _matmul_integer(rows: int, a_zero: np.ndarray) -> flowrt.Network:
    """a (1, 8) uint8 -> Reshape (rows, 8 // rows) -> MatMulInteger by (8 // rows, 3)."""
    net = flowrt.Network()
    a = net.add_input("a", TensorInfo((1, 8), "uint8"))
    folded = net.add_layer("Reshape", None, [a, np.array([rows, 8 // rows], np.int64)], name="fold")
    b = np.ones((8 // rows, 3), np.uint8)
    mm = net.add_layer("MatMulInteger", None, [folded, b, a_zero, np.zeros((3,), np.uint8)], name="mm")
    net.add_output("y", mm)
    return net


def test_a_zero_point_per_row_of_a_batched_a_is_refused():
    """One row per sample: a zero point per tensor re-batches. Two rows per sample (a Reshape
    folded them into the batch axis): a zero point per row would have two rows, not 2N."""
    one = flowrt.set_batch(_matmul_integer(1, np.zeros((1,), np.uint8)), BATCH)
    assert one.graph.output_layers[0].input_infos[0].shape == (BATCH, 3)
    with pytest.raises(ShapeError, match="one per tensor is expected"):
        flowrt.set_batch(_matmul_integer(2, np.zeros((2,), np.uint8)), BATCH)


def test_every_quantized_kind_and_every_kind_the_qdq_fold_makes_has_a_rule():
    made = set(fold_qdq._QUANTIZED.values()) | {"QLinearAdd", "QLinearMul"}
    quantized = {
        kind
        for kind in known_layer_kinds()
        if kind.startswith("QLinear") or kind.endswith(("QuantizeLinear", "Integer")) or kind == "QGemm"
    }
    assert made <= quantized
    assert sorted(quantized - set(RULES)) == []
