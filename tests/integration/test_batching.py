"""The nine light models, exported for a batch of 1, re-batched: each sample's logits match a
batch-1 run of that sample, and a batching stream gives each request its own result."""

import numpy as np
import pytest
import trio

import flowrt
from flowrt.models import LIGHT_MODELS, light_model

FAST = ("shufflenet", "squeezenet", "inception_v1")
BACKENDS = ["CpuAcc", "CpuRef"]


def _logits(name: str) -> flowrt.Network:
    """The model without its last Softmax: the light models' softmax outputs are uniform; their
    logits differ from sample to sample in most of them (densenet121's and inception_v2's
    hardly depend on the input: samples mixed up there are caught by the unit tests)."""
    net = flowrt.onnx.load(light_model(name))
    for softmax in net.graph.of_kind("Softmax"):
        net.graph.reroute(softmax.outputs[0], softmax.inputs[0].source)
        net.graph.remove_layer(softmax)
    return net


@pytest.mark.parametrize("name", LIGHT_MODELS)
def test_every_light_model_rebatches_to_8_rewriting_its_batch_1_reshapes(name):
    net = flowrt.onnx.load(light_model(name))
    opt = flowrt.optimize(net, backends=BACKENDS)
    batched = flowrt.set_batch(opt, 8)
    (output,) = batched.graph.output_layers
    assert output.input_infos[0].shape[:2] == (8, 1000)
    reshapes = [layer for layer in batched.graph.of_kind("Reshape") if layer.backend]
    rewritten = [line for line in batched.passes if line.startswith("re-batched Reshape")]
    assert len(rewritten) == len(reshapes)
    assert all(layer.outputs[0].info.shape[0] == 8 for layer in reshapes)


@pytest.mark.parametrize(
    "name, batch",
    [(n, 3) if n in FAST else pytest.param(n, 8, marks=pytest.mark.slow) for n in LIGHT_MODELS],
)
async def test_rebatched_light_model_matches_batch_1_per_sample(name, batch):
    opt = flowrt.optimize(_logits(name), backends=BACKENDS)
    async with flowrt.Runtime() as rt:
        one = await rt.load(opt, max_in_flight=1)
        many = await rt.load(opt, max_in_flight=1, batch=batch)
        ((input_name, info),) = many.inputs.items()
        x = np.random.default_rng(batch).random(info.shape, dtype=np.float32)
        (got,) = (await many.run({input_name: x})).values()
        for i in range(batch):
            (expected,) = (await one.run({input_name: x[i : i + 1]})).values()
            np.testing.assert_allclose(got[i : i + 1], expected, rtol=2e-5)


async def test_a_batching_stream_gives_each_light_model_request_its_own_logits():
    opt = flowrt.optimize(_logits("shufflenet"), backends=BACKENDS)
    rng = np.random.default_rng(3)
    async with flowrt.Runtime() as rt:
        model = await rt.load(opt, max_in_flight=1)
        ((input_name, info),) = model.inputs.items()
        images = [rng.random(info.shape, dtype=np.float32) for _ in range(5)]
        expected = [(await model.run({input_name: x}))["gpu_0/softmax_1"] for x in images]
        async with model.stream(max_batch=4, max_delay=0.05) as s:

            async def produce():
                for x in images:
                    await s.send({input_name: x})
                s.close()

            async with trio.open_nursery() as nursery:
                nursery.start_soon(produce)
                got = [outputs["gpu_0/softmax_1"] async for outputs in s]
    for g, e in zip(got, expected, strict=True):
        np.testing.assert_allclose(g, e, rtol=2e-5)
    assert not np.allclose(expected[0], expected[1], rtol=2e-5)  # a request given another's rows would show
