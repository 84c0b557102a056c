"""Feeds are checked against the network's inputs before anything runs."""

import numpy as np
import pytest

import flowrt
from flowrt.errors import DataTypeError, InputError, ShapeError
from flowrt.types import TensorInfo


@pytest.fixture(scope="module")
def session():
    net = flowrt.Network()
    x = net.add_input("data_0", TensorInfo((1, 3, 4, 4)))
    n = net.add_input("tokens", TensorInfo(("batch", 5), "int64"))
    net.add_output("y", net.add_layer("Relu", inputs=[x]))
    net.add_output("t", net.add_layer("Neg", inputs=[n]))
    return flowrt.InferenceSession(net, backends=["CpuRef"])


def _feeds(**override):
    feeds = {"data_0": np.zeros((1, 3, 4, 4), np.float32), "tokens": np.zeros((2, 5), np.int64)}
    feeds.update(override)
    return feeds


def test_missing_input_is_named(session):
    feeds = _feeds()
    del feeds["tokens"]
    with pytest.raises(InputError, match=r"missing input 'tokens'.*int64"):
        session.run(None, feeds)


def test_unknown_input_is_named_with_the_real_ones(session):
    with pytest.raises(InputError, match=r"unknown input 'date_0'.*data_0"):
        session.run(None, _feeds(date_0=np.zeros(1)))


def test_wrong_dtype_says_expected_and_found(session):
    with pytest.raises(DataTypeError, match=r"input 'data_0' expects float32, got float64"):
        session.run(None, _feeds(data_0=np.zeros((1, 3, 4, 4))))


def test_wrong_shape_says_expected_and_found(session):
    with pytest.raises(ShapeError, match=r"input 'data_0' expects shape \(1, 3, 4, 4\), got \(1, 3, 4, 5\)"):
        session.run(None, _feeds(data_0=np.zeros((1, 3, 4, 5), np.float32)))


def test_wrong_rank_is_a_shape_error(session):
    with pytest.raises(ShapeError, match=r"expects shape \(batch, 5\), got \(5,\)"):
        session.run(None, _feeds(tokens=np.zeros(5, np.int64)))


def test_symbolic_dimension_accepts_any_size(session):
    for batch in (1, 3, 7):
        _, t = session.run(None, _feeds(tokens=np.ones((batch, 5), np.int64)))
        np.testing.assert_array_equal(t, -np.ones((batch, 5)))


def test_feeds_must_be_a_mapping(session):
    with pytest.raises(InputError, match="mapping"):
        session.run(None, [np.zeros(1)])


def test_unknown_output_name(session):
    with pytest.raises(InputError, match=r"unknown output 'z'"):
        session.run(["z"], _feeds())


def test_session_describes_inputs_and_outputs(session):
    inputs = {a.name: a for a in session.get_inputs()}
    assert inputs["data_0"].shape == [1, 3, 4, 4]
    assert inputs["tokens"].shape == ["batch", 5]
    assert inputs["tokens"].type == "tensor(int64)"
    assert [o.name for o in session.get_outputs()] == ["y", "t"]
