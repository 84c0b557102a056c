"""run_async callbacks run off the session's loop: they may run, run_async and close the
session they belong to without deadlocking it."""

import threading

import numpy as np
import pytest
from netbuild import branchy_expected, branchy_network

import flowrt
from flowrt.errors import ArgumentError, FlowrtError

X = np.ones((1, 4), np.float32)


def _call_back_into(session, body, count: int = 1) -> tuple[dict, threading.Event]:
    """Starts ``count`` run_async runs whose callbacks call ``body(outputs, error)``; returns
    what each body returned or raised, by run, and an event set when all have."""
    outcomes: dict = {}
    done = threading.Event()

    def callback(outputs, user_data, error) -> None:
        try:
            outcomes[user_data] = body(outputs, error)
        except BaseException as e:
            outcomes[user_data] = e
        if len(outcomes) == count:
            done.set()

    for i in range(count):
        session.run_async(None, {"x": X}, callback, i)
    return outcomes, done


def test_a_callback_can_run_its_session_synchronously():
    with flowrt.InferenceSession(branchy_network(), backends=["CpuRef"]) as session:
        outcomes, done = _call_back_into(session, lambda outputs, error: session.run(None, {"x": 2 * X}))
        assert done.wait(10), "the nested run deadlocked"
        # and the session still serves other threads
        (y,) = session.run(None, {"x": X})
    ((nested,),) = outcomes.values()
    np.testing.assert_allclose(nested, branchy_expected(2 * X), rtol=1e-6)
    np.testing.assert_allclose(y, branchy_expected(X), rtol=1e-6)


def test_many_callbacks_blocked_in_nested_runs_at_once_all_finish():
    with flowrt.InferenceSession(branchy_network(), backends=["CpuRef"]) as session:
        outcomes, done = _call_back_into(session, lambda o, e: session.run(None, {"x": X}), count=40)
        assert done.wait(10), "nested runs deadlocked"
    assert all(isinstance(v, list) for v in outcomes.values()), outcomes


def test_a_callback_can_start_another_run_async():
    with flowrt.InferenceSession(branchy_network(), backends=["CpuRef"]) as session:
        second = threading.Event()
        outcomes, done = _call_back_into(
            session, lambda o, e: session.run_async(None, {"x": X}, lambda *args: second.set())
        )
        assert done.wait(10) and second.wait(10)
    assert outcomes == {0: None}


def test_close_from_a_callback_returns_and_the_session_ends_after_it():
    session = flowrt.InferenceSession(branchy_network(), backends=["CpuRef"])
    loop_thread = session._thread._thread
    outcomes, done = _call_back_into(session, lambda o, e: session.close())
    assert done.wait(10), "close() from a callback deadlocked"
    loop_thread.join(10)
    assert not loop_thread.is_alive()
    assert outcomes == {0: None}
    with pytest.raises(FlowrtError, match="this InferenceSession is closed"):
        session.run(None, {"x": X})


def test_a_callback_running_while_the_session_closes_gets_a_closed_error_from_its_nested_run():
    session = flowrt.InferenceSession(branchy_network(), backends=["CpuRef"])
    entered = threading.Event()

    def run_until_closed(outputs, error):
        entered.set()
        for _ in range(100_000):
            session.run(None, {"x": X})  # raises once close() has begun
        return "never closed"

    outcomes, done = _call_back_into(session, run_until_closed)
    assert entered.wait(10)
    closer = threading.Thread(target=session.close)
    closer.start()
    closer.join(10)
    assert not closer.is_alive(), "close() deadlocked with a callback inside run()"
    assert done.is_set()  # close() waits for the callbacks it started
    (error,) = outcomes.values()
    assert isinstance(error, FlowrtError)
    assert "InferenceSession" in str(error) and "closed" in str(error)


def test_a_callback_that_raises_is_logged_and_the_session_goes_on(caplog):
    def boom(outputs, user_data, error):
        raise ValueError("the caller's bug")

    with flowrt.InferenceSession(branchy_network(), backends=["CpuRef"]) as session:
        session.run_async(None, {"x": X}, boom)
        outcomes, done = _call_back_into(session, lambda o, e: o)
        assert done.wait(10)
        (y,) = session.run(None, {"x": X})
    assert any("callback raised" in r.getMessage() and r.exc_info for r in caplog.records)
    np.testing.assert_allclose(y, branchy_expected(X), rtol=1e-6)


def test_run_async_refuses_a_callback_that_cannot_be_called():
    with flowrt.InferenceSession(branchy_network(), backends=["CpuRef"]) as session:
        with pytest.raises(
            ArgumentError, match="callback must be a callable .*, got 'not a function' \\(str\\)"
        ):
            session.run_async(None, {"x": X}, "not a function")
