"""optimize_subgraph substitutions: applied, checked, recorded, reported and saved."""

import numpy as np
import pytest
import trio
from fakes import PartialBackend

import flowrt
from flowrt import serialize
from flowrt.errors import BackendError
from flowrt.models import light_model, pattern_input
from flowrt.registry import BackendRegistry, OptimizationViews
from flowrt.types import TensorInfo


def matmul_add_relu() -> tuple[flowrt.Network, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(3)
    w = rng.standard_normal((8, 5)).astype(np.float32)
    b = rng.standard_normal(5).astype(np.float32)
    net = flowrt.Network()
    x = net.add_input("x", TensorInfo((4, 8)))
    mm = net.add_layer("MatMul", inputs=[x, w], name="mm")
    add = net.add_layer("Add", inputs=[mm, b], name="add")
    net.add_output("y", net.add_layer("Relu", inputs=[add], name="relu"))
    return net, w, b


def run(opt: flowrt.OptimizedNetwork, feeds: dict) -> dict:
    async def main():
        async with flowrt.Runtime(cpu_workers=1) as rt:
            return await (await rt.load(opt, max_in_flight=1)).run(feeds)

    return trio.run(main)


@pytest.mark.parametrize(
    "backend, fused_kinds", [("CpuAcc", ("MatMul", "Add", "Relu")), ("CpuRef", ("MatMul", "Add"))]
)
def test_matmul_add_becomes_one_gemm(backend, fused_kinds):
    net, w, b = matmul_add_relu()
    opt = flowrt.optimize(net, backends=[backend])
    (record,) = opt.substitutions
    assert (record.backend, record.replaced_kinds, record.kind, record.layer) == (
        backend,
        fused_kinds,
        "Gemm",
        "mm",
    )
    assert opt.graph.layers["mm"].kind == "Gemm" and "add" not in opt.graph.layers
    x = np.random.default_rng(0).standard_normal((4, 8)).astype(np.float32)
    y = run(opt, {"x": x})["y"]
    np.testing.assert_allclose(y, np.maximum(x @ w + b, 0), rtol=1e-5, atol=1e-5)
    assert f"{backend}: MatMul 'mm' + Add 'add'" in opt.report()


def sequence_linear_relu(bias_shape=(5,)) -> tuple[flowrt.Network, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(4)
    w = rng.standard_normal((8, 5)).astype(np.float32)
    b = rng.standard_normal(bias_shape).astype(np.float32)
    net = flowrt.Network()
    x = net.add_input("x", TensorInfo((1, 6, 8)))
    mm = net.add_layer("MatMul", inputs=[x, w], name="mm")
    add = net.add_layer("Add", inputs=[b, mm], name="add")
    net.add_output("y", net.add_layer("Relu", inputs=[add], name="relu"))
    return net, w, b


@pytest.mark.parametrize(
    "backend, fused_kinds", [("CpuAcc", ("MatMul", "Add", "Relu")), ("CpuRef", ("MatMul", "Add"))]
)
def test_a_linear_layer_on_a_sequence_becomes_one_matmul_bias(backend, fused_kinds, tmp_path):
    net, w, b = sequence_linear_relu()
    opt = flowrt.optimize(net, backends=[backend])
    (record,) = opt.substitutions
    assert (record.replaced_kinds, record.kind) == (fused_kinds, "MatMulBias")
    assert "add" not in opt.graph.layers
    x = np.random.default_rng(0).standard_normal((1, 6, 8)).astype(np.float32)
    expected = np.maximum(x @ w + b, 0)
    np.testing.assert_allclose(run(opt, {"x": x})["y"], expected, rtol=1e-5, atol=1e-5)
    serialize.save(opt, tmp_path / "m.flowrt")
    np.testing.assert_allclose(
        run(serialize.load(tmp_path / "m.flowrt"), {"x": x})["y"], expected, rtol=1e-5, atol=1e-5
    )
    batched = flowrt.set_batch(opt, 3)
    x3 = np.random.default_rng(1).standard_normal((3, 6, 8)).astype(np.float32)
    np.testing.assert_allclose(run(batched, {"x": x3})["y"], np.maximum(x3 @ w + b, 0), rtol=1e-5, atol=1e-5)


def test_a_bias_that_is_not_one_vector_along_the_columns_stays_an_add():
    net, _, _ = sequence_linear_relu(bias_shape=(6, 5))
    opt = flowrt.optimize(net, backends=["CpuAcc"])
    assert "MatMulBias" not in {layer.kind for layer in opt.graph}
    assert opt.graph.layers["add"].kind == "Add"


def test_conv_relu_substitution_on_cpuacc_gives_the_unfused_outputs():
    net = flowrt.onnx.load(light_model("squeezenet"))
    opt = flowrt.optimize(net, backends=["CpuAcc"])
    assert {s.replaced_kinds for s in opt.substitutions} == {("Conv", "Relu")}
    assert "Relu" not in {layer.kind for layer in opt.graph}
    assert "substitutions (26):" in opt.report()
    unfused = flowrt.optimize(
        net, backends=["CpuAcc"], options=flowrt.OptimizerOptions(fuse_activations=False)
    )
    assert not unfused.substitutions
    feeds = {"data_0": pattern_input(TensorInfo((1, 3, 224, 224)))}
    np.testing.assert_array_equal(run(opt, feeds)["softmaxout_1"], run(unfused, feeds)["softmaxout_1"])


def test_fuse_activations_off_keeps_activations_out_of_substitutions():
    net, _, _ = matmul_add_relu()
    opt = flowrt.optimize(net, backends=["CpuAcc"], options=flowrt.OptimizerOptions(fuse_activations=False))
    (record,) = opt.substitutions
    assert record.replaced_kinds == ("MatMul", "Add")
    assert opt.graph.layers["relu"].kind == "Relu"


def test_substitutions_survive_save_and_load(tmp_path):
    net, _, _ = matmul_add_relu()
    opt = flowrt.optimize(net, backends=["CpuAcc", "CpuRef"])
    serialize.save(opt, tmp_path / "m.flowrt")
    loaded = serialize.load(tmp_path / "m.flowrt")
    assert loaded.substitutions == opt.substitutions
    assert loaded.graph.layers["mm"].activation == opt.graph.layers["mm"].activation


class Forgetful(PartialBackend):
    """Answers nothing for the subgraphs it is handed."""

    def optimize_subgraph(self, view):
        return OptimizationViews()


class Greedy(PartialBackend):
    """Substitutes its subgraph by a layer of another shape."""

    def optimize_subgraph(self, view):
        from flowrt.registry import ReplacementLayer

        views = OptimizationViews()
        layer = view.layers[0]
        views.add_substitution(
            view.layers,
            ReplacementLayer(
                "Transpose", flowrt.descriptors.Transpose(perm=(1, 0)), [layer.inputs[0].source]
            ),
        )
        return views


@pytest.mark.parametrize(
    "backend, message",
    [
        (Forgetful("Odd", {"Relu", "Add"}), "must put each layer"),
        (Greedy("Odd", {"Relu", "Add"}), "the replacement's outputs are"),
    ],
)
def test_a_malformed_answer_is_a_backend_error(backend, message):
    registry = BackendRegistry()
    registry.register("Odd", lambda: backend)
    net = flowrt.Network()
    x = net.add_input("x", TensorInfo((2, 3)))
    add = net.add_layer("Add", inputs=[x, np.ones((1, 3), np.float32)], name="add")
    net.add_output("y", net.add_layer("Relu", inputs=[net.add_layer("Add", inputs=[add, add])], name="relu"))
    with pytest.raises(BackendError, match=f"backend Odd.*{message}"):
        flowrt.optimize(net, backends=["Odd"], registry=registry)
