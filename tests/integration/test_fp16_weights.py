"""``OptimizerOptions(reduce_fp32_to_fp16=True)`` on CpuAcc, through the public surface: the
weights of its Gemm and MatMul layers kept as float16 (half the bytes), computed in float32,
the outputs within 1e-2 of CpuRef's."""

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import flowrt
from flowrt.cli import main
from flowrt.workers.cpu.acc import packed_gemm

pytestmark = pytest.mark.skipif(
    not packed_gemm.AVAILABLE, reason="no register tiles on this CPU: BLAS, float32"
)


def _mlp(path):
    """A sequence of 16 tokens through two Linear layers (MatMul + Add, ReLU) and a Gemm head."""
    rng = np.random.default_rng(1)
    w1 = (rng.standard_normal((64, 256)) / 8).astype(np.float32)
    b1 = (rng.standard_normal(256) / 10).astype(np.float32)
    w2 = (rng.standard_normal((256, 64)) / 16).astype(np.float32)
    b2 = (rng.standard_normal(64) / 10).astype(np.float32)
    w3 = (rng.standard_normal((10, 64)) / 8).astype(np.float32)
    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["h1"]),
        helper.make_node("Add", ["h1", "b1"], ["h2"]),
        helper.make_node("Relu", ["h2"], ["h3"]),
        helper.make_node("MatMul", ["h3", "w2"], ["h4"]),
        helper.make_node("Add", ["h4", "b2"], ["h5"]),
        helper.make_node("Reshape", ["h5", "shape"], ["h6"]),
        helper.make_node("Gemm", ["h6", "w3"], ["y"], transB=1),
    ]
    constants = {"w1": w1, "b1": b1, "w2": w2, "b2": b2, "w3": w3, "shape": np.array([16, 64], np.int64)}
    graph = helper.make_graph(
        nodes,
        "mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, (1, 16, 64))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, (16, 10))],
        [numpy_helper.from_array(v, k) for k, v in constants.items()],
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return str(path), {"x": rng.standard_normal((1, 16, 64)).astype(np.float32)}


async def _run(opt, feeds):
    async with flowrt.Runtime(cpu_workers=2) as rt:
        model = await rt.load(opt)
        outputs = await model.run(feeds)
        return outputs["y"], model.memory_report().get("CpuAcc", {}).get("weights_bytes", 0)


@pytest.mark.trio
async def test_cpuacc_keeps_gemm_and_matmul_weights_as_float16_when_reducing(tmp_path):
    path, feeds = _mlp(tmp_path / "mlp.onnx")
    network = flowrt.onnx.load(path)
    want, _ = await _run(flowrt.optimize(network, backends=["CpuRef"]), feeds)
    full = flowrt.optimize(network, backends=["CpuAcc", "CpuRef"])
    half = flowrt.optimize(
        network, backends=["CpuAcc", "CpuRef"], options=flowrt.OptimizerOptions(reduce_fp32_to_fp16=True)
    )
    assert (
        "reduce_fp32_to_fp16: CpuAcc keeps the weights of 3 Gemm/MatMulBias layers as float16 where its "
        "kernels read them so, computing in float32" in half.passes
    )
    assert [layer.backend for layer in half.graph if layer.kind == "Cast"] == []  # the graph stays float32
    (y32, bytes32), (y16, bytes16) = await _run(full, feeds), await _run(half, feeds)
    assert y16.dtype == np.float32
    assert bytes32 > 0 and bytes16 == bytes32 // 2
    scale = np.abs(want).max()
    np.testing.assert_allclose(y32, want, rtol=0, atol=1e-5 * scale)
    np.testing.assert_allclose(y16, want, rtol=0, atol=1e-2 * scale)
    assert np.abs(y16 - want).max() > np.abs(y32 - want).max()  # the rounding of the weights shows
    # a converted file keeps the option, and so its results
    flowrt.save(half, str(tmp_path / "mlp.flowrt"))
    again = flowrt.load(str(tmp_path / "mlp.flowrt"))
    assert again.options.reduce_fp32_to_fp16
    y_again, bytes_again = await _run(again, feeds)
    np.testing.assert_array_equal(y_again, y16)
    assert bytes_again == bytes16


def test_the_command_line_takes_fp16_and_inspect_lists_what_it_changed(tmp_path, capsys):
    path, _ = _mlp(tmp_path / "mlp.onnx")
    assert main(["inspect", path, "--backends", "CpuAcc,CpuRef", "--fp16", "--layers"]) == 0
    assert "CpuAcc keeps the weights of 3 Gemm/MatMulBias layers as float16" in capsys.readouterr().out
    target = tmp_path / "mlp.flowrt"
    assert main(["convert", path, "--backends", "CpuAcc,CpuRef", "--fp16", "-o", str(target)]) == 0
    assert flowrt.load(str(target)).options.reduce_fp32_to_fp16
    assert main(["run", str(target), "--fp16"]) == 0  # converted with it: the flag agrees
    plain = tmp_path / "plain.flowrt"
    assert main(["convert", path, "--backends", "CpuAcc,CpuRef", "-o", str(plain)]) == 0
    capsys.readouterr()
    assert main(["run", str(plain), "--fp16"]) != 0
    assert f"--fp16: {plain} was converted without reduce_fp32_to_fp16" in capsys.readouterr().err
