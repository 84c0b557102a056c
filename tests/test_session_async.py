"""InferenceSession.run_async: callbacks from the session's callback threads."""

import threading

import numpy as np
import pytest
from netbuild import branchy_expected, branchy_network

import flowrt
from flowrt.errors import FlowrtError
from flowrt.types import TensorInfo


def _results_of(session, count):
    done = threading.Event()
    results, threads = {}, set()

    def callback(outputs, user_data, error):
        results[user_data] = (outputs, error)
        threads.add(threading.current_thread().name)
        if len(results) == count:
            done.set()

    return results, threads, done, callback


def test_run_async_calls_back_with_outputs_in_order_for_each_request():
    with flowrt.InferenceSession(branchy_network(), backends=["CpuRef"]) as session:
        results, threads, done, callback = _results_of(session, 6)
        inputs = {i: np.full((2, 4), i / 4 - 0.5, np.float32) for i in range(6)}
        for i, x in inputs.items():
            session.run_async(None, {"x": x}, callback, i)
        assert done.wait(10)
        # the synchronous run shares the same loop once it exists
        (y,) = session.run(None, {"x": inputs[5]})
    assert threads == {"flowrt-session-callback"}
    for i, x in inputs.items():
        outputs, error = results[i]
        assert error == ""
        np.testing.assert_allclose(outputs[0], branchy_expected(x), rtol=1e-6)
    np.testing.assert_allclose(y, branchy_expected(inputs[5]), rtol=1e-6)


def test_run_async_reports_errors_through_the_callback():
    with flowrt.InferenceSession(branchy_network(), backends=["CpuRef"]) as session:
        results, _, done, callback = _results_of(session, 1)
        session.run_async(None, {"x": np.zeros((2, 4))}, callback, "bad")
        assert done.wait(10)
    outputs, error = results["bad"]
    assert outputs is None
    assert error == "DataTypeError: input 'x' expects float32, got float64"


def test_run_async_checks_output_names_at_once():
    net = flowrt.Network()
    x = net.add_input("x", TensorInfo((1,)))
    net.add_output("y", net.add_layer("Relu", inputs=[x]))
    with flowrt.InferenceSession(net, backends=["CpuRef"]) as session:
        with pytest.raises(flowrt.errors.InputError, match="unknown output 'z'"):
            session.run_async(["z"], {"x": np.zeros(1, np.float32)}, lambda *a: None)


def test_close_stops_the_runtime_thread():
    session = flowrt.InferenceSession(branchy_network(), backends=["CpuRef"])
    results, _, done, callback = _results_of(session, 1)
    session.run_async(None, {"x": np.ones((1, 4), np.float32)}, callback, 0)
    assert done.wait(10)
    thread = session._thread._thread
    session.close()
    assert not thread.is_alive()
    with pytest.raises(FlowrtError, match="InferenceSession is closed"):
        session.run(None, {"x": np.ones((1, 4), np.float32)})


async def test_run_works_from_inside_a_trio_loop():
    with flowrt.InferenceSession(branchy_network(), backends=["CpuRef"]) as session:
        x = np.ones((1, 4), np.float32)
        (y,) = session.run(None, {"x": x})
    np.testing.assert_allclose(y, branchy_expected(x), rtol=1e-6)
