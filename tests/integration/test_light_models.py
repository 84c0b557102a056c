"""The nine light models onnx ships match their expected outputs, through every entry point.

(The onnx backend conformance test runs them a third way, through ``flowrt.onnx.backend``.)
"""

import numpy as np
import pytest
import trio

import flowrt
from flowrt.cli import main
from flowrt.models import LIGHT_MODELS, expected_outputs, expected_tolerance, light_model, pattern_input


def test_light_model_tolerances_are_the_ones_onnx_ships():
    assert expected_tolerance(light_model("densenet121"))["rtol"] == 2e-3
    assert expected_tolerance(light_model("squeezenet")) == {"rtol": 1e-3, "atol": 1e-7}


@pytest.mark.parametrize("name", LIGHT_MODELS)
def test_light_model_matches_expected_output_through_inference_session(name):
    path = light_model(name)
    sess = flowrt.InferenceSession(path, backends=["CpuRef"])
    feeds = {arg.name: pattern_input(flowrt.TensorInfo(arg.shape, np.float32)) for arg in sess.get_inputs()}
    outputs = sess.run(None, feeds)
    expected = expected_outputs(path)
    assert len(expected) == len(outputs) == 1
    np.testing.assert_allclose(outputs[0], expected[0], **expected_tolerance(path))


@pytest.mark.parametrize("name", LIGHT_MODELS)
def test_light_model_matches_expected_output_through_flowrt_run(name, tmp_path, capsys):
    path = light_model(name)
    assert main(["run", str(path), "--backends", "CpuRef", "--output-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "vs the model's shipped expected output: match" in out
    (written,) = list(tmp_path.glob("*.npy"))
    np.testing.assert_allclose(np.load(written), expected_outputs(path)[0], **expected_tolerance(path))


@pytest.mark.parametrize("name", ["squeezenet", "inception_v1"])
def test_light_model_through_the_async_api(name):
    path = light_model(name)

    async def main_async():
        opt = flowrt.optimize(flowrt.onnx.load(path), backends=["CpuRef"])
        async with flowrt.Runtime() as rt:
            model = await rt.load(opt)
            feeds = {n: pattern_input(info) for n, info in model.inputs.items()}
            return await model.run(feeds)

    outputs = trio.run(main_async)
    np.testing.assert_allclose(
        list(outputs.values())[0], expected_outputs(path)[0], **expected_tolerance(path)
    )
