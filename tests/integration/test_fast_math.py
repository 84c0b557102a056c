"""``OptimizerOptions(fast_math=True)`` through the public surface: CpuAcc takes Winograd's 4x4
output tiles only then, whose errors are several times those of the exact algorithms; off,
its results stay as close to CpuRef's as ONNX Runtime's (docs/performance.md)."""

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import flowrt
from flowrt.cli import main
from flowrt.errors import InputError


def _conv_model(path):
    """A 3x3 conv of 64 channels at 28x28 (what ResNet's middle stages are), random weights."""
    rng = np.random.default_rng(0)
    w = (rng.standard_normal((64, 64, 3, 3)) * np.sqrt(2 / 576)).astype(np.float32)
    b = (rng.standard_normal(64) * 0.1).astype(np.float32)
    node = helper.make_node("Conv", ["x", "w", "b"], ["y"], pads=[1, 1, 1, 1])
    graph = helper.make_graph(
        [node],
        "conv",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, (1, 64, 28, 28))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, (1, 64, 28, 28))],
        [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")],
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    x = np.maximum(rng.standard_normal((1, 64, 28, 28)), 0).astype(np.float32)
    return str(path), {"x": x}


async def _run(opt, feeds):
    async with flowrt.Runtime(cpu_workers=2) as rt:
        model = await rt.load(opt)
        return (await model.run(feeds))["y"]


def _distance(got, want):
    """Largest difference, relative to the output's largest magnitude."""
    return float(np.abs(got.astype(np.float64) - want).max() / np.abs(want).max())


@pytest.mark.trio
async def test_fast_math_trades_exactness_only_where_it_is_on(tmp_path):
    path, feeds = _conv_model(tmp_path / "conv.onnx")
    network = flowrt.onnx.load(path)
    want = await _run(flowrt.optimize(network, backends=["CpuRef"]), feeds)
    exact = flowrt.optimize(network, backends=["CpuAcc"])
    fast = flowrt.optimize(network, backends=["CpuAcc"], options=flowrt.OptimizerOptions(fast_math=True))
    off, on = await _run(exact, feeds), await _run(fast, feeds)
    # off: within the rounding of a float32 GEMM (ONNX Runtime's is 2-5e-7 of the output's
    # magnitude on such convs); on: F(4x4, 3x3)'s errors, about 5e-6, bounded
    assert _distance(off, want) <= 1.5e-6
    assert 2 * _distance(off, want) < _distance(on, want) <= 2e-5
    # the option travels with a converted network, and so do its results
    saved = tmp_path / "conv.flowrt"
    flowrt.save(fast, str(saved))
    again = flowrt.load(str(saved))
    assert again.options.fast_math
    np.testing.assert_array_equal(await _run(again, feeds), on)


def test_the_command_line_takes_fast_math_and_inspect_says_it_is_on(tmp_path, capsys):
    path, _ = _conv_model(tmp_path / "conv.onnx")
    assert main(["inspect", path, "--backends", "CpuAcc", "--fast-math"]) == 0
    assert "fast math: on (backends may take faster, less exact algorithms)" in capsys.readouterr().out
    assert main(["inspect", path, "--backends", "CpuAcc"]) == 0
    assert "fast math" not in capsys.readouterr().out
    target = tmp_path / "conv.flowrt"
    assert main(["convert", path, "--backends", "CpuAcc", "-o", str(target)]) == 0
    assert not flowrt.load(str(target)).options.fast_math
    # a file converted without it cannot run with it: the choice was made at conversion
    assert main(["run", str(target), "--fast-math"]) != 0
    err = capsys.readouterr().err
    assert f"--fast-math: {target} was converted without fast_math" in err
    assert "convert the model again with --fast-math" in err


def test_open_model_refuses_fast_math_on_a_file_converted_without_it(tmp_path):
    from flowrt.cli.model import open_model

    path, _ = _conv_model(tmp_path / "conv.onnx")
    target = tmp_path / "conv.flowrt"
    flowrt.save(flowrt.optimize(flowrt.onnx.load(path), backends=["CpuAcc"]), str(target))
    with pytest.raises(InputError, match="was converted without fast_math"):
        open_model(str(target), None, flags=("fast_math",))
    assert open_model(path, "CpuAcc", flags=("fast_math",)).options.fast_math
