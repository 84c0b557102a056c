"""flowrt.ray's arguments are checked where they are given, before anything starts on a cluster."""

from __future__ import annotations

import numpy as np
import pytest

import flowrt
from flowrt import TensorInfo
from flowrt.errors import ArgumentError, FlowrtError, ModelLoadError

ray = pytest.importorskip(
    "ray", reason="flowrt.ray needs Ray: pip install 'flowrt[ray]'", exc_type=ImportError
)
import flowrt.ray  # noqa: E402  # with Ray only
from flowrt.ray import Stage  # noqa: E402


def relu_net() -> flowrt.Network:
    net = flowrt.Network()
    net.add_output("y", net.add_layer("Relu", inputs=[net.add_input("x", TensorInfo((1, 4)))]))
    return net


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({"replicas": 0}, "replicas must be a positive int, got 0"),
        ({"pools": True}, "pools must be a positive int, got True"),
        ({"max_in_flight": -1}, "max_in_flight must be a positive int, got -1"),
        ({"resources": {"gpu": -1}}, "resources must map resource names to non-negative amounts"),
        ({"node": "ab", "placement_group": object()}, "give node or placement_group, not both"),
        ({"replicas": 2, "bundle_indices": [0]}, r"one bundle per replica \(2\), got \[0\]"),
    ],
)
def test_a_bad_stage_argument_is_an_argument_error_naming_it(arguments, message):
    with pytest.raises(ArgumentError, match=message):
        Stage(relu_net(), **arguments)


def test_a_stage_model_must_be_a_network_a_path_or_bytes():
    with pytest.raises(ArgumentError, match="model must be a flowrt.Network.*got ndarray"):
        Stage(np.zeros(3))


def test_a_stage_bounds_its_requests_by_twice_its_pools_per_replica_by_default():
    assert Stage(relu_net(), pools=3).per_replica == 6
    assert Stage(relu_net(), pools=3, max_in_flight=1).per_replica == 1
    assert Stage(relu_net(), cpu_workers=2).actor_options(0)["num_cpus"] == 2
    assert Stage(relu_net(), cpu_workers=2, num_cpus=0.5).actor_options(0)["num_cpus"] == 0.5


@pytest.mark.parametrize(
    ("stages", "names", "message"),
    [
        ([], None, "at least one stage"),
        (Stage(relu_net()), None, "must be a list of Stages and functions, got one"),
        ([Stage(relu_net()), 3], None, "stage 1 must be a flowrt.ray.Stage or a function, got int"),
        ([Stage(relu_net())], ["a", "b"], "2 names given for 1 stages"),
    ],
)
def test_a_bad_pipeline_is_an_argument_error(stages, names, message):
    with pytest.raises(ArgumentError, match=message):
        flowrt.ray.Pipeline(stages, names=names)


async def test_a_pipeline_needs_ray_initialized_and_its_async_with(monkeypatch):
    pipeline = flowrt.ray.Pipeline([Stage(relu_net())])
    with pytest.raises(FlowrtError, match="not open yet: use it within its 'async with'"):
        await pipeline.run({"x": np.zeros((1, 4), np.float32)})
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    with pytest.raises(FlowrtError, match=r"needs a Ray cluster: call ray.init\(address=...\)"):
        async with pipeline:
            pass


async def test_a_missing_model_file_is_a_model_load_error_naming_it(monkeypatch, tmp_path):
    monkeypatch.setattr(ray, "is_initialized", lambda: True)  # it fails before reaching Ray
    missing = tmp_path / "missing.onnx"
    with pytest.raises(ModelLoadError, match="cannot read the model file .*missing.onnx"):
        async with flowrt.ray.Pipeline([Stage(missing)]):
            pass
