"""InferenceSession.close in every state: runs in flight, pending callbacks, threads inside
run(), several closers, garbage collection and interpreter exit."""

import gc
import logging
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from gatedbackend import gated_model
from netbuild import branchy_network

import flowrt
from flowrt.errors import FlowrtError

CLOSED_CALLBACK_ERROR = "FlowrtError: this InferenceSession was closed before the run finished"
ONE = {"x": np.ones((1,), np.float32)}


class Callbacks:
    """Records each call of a run_async callback by its user_data."""

    def __init__(self) -> None:
        self.calls: dict[object, list[tuple[object, str]]] = {}
        self.called = threading.Condition()

    def __call__(self, outputs, user_data, error) -> None:
        with self.called:
            self.calls.setdefault(user_data, []).append((outputs, error))
            self.called.notify_all()

    def wait_for(self, *keys: object, timeout: float = 10) -> bool:
        with self.called:
            return self.called.wait_for(lambda: all(k in self.calls for k in keys), timeout)


def _in_thread(fn, *args) -> tuple[threading.Thread, list]:
    outcome: list = []

    def target() -> None:
        try:
            outcome.append(fn(*args))
        except BaseException as e:
            outcome.append(e)

    thread = threading.Thread(target=target)
    thread.start()
    return thread, outcome


def _within(seconds: float, condition) -> bool:
    """Whether ``condition()`` holds within ``seconds`` of real time (polled)."""
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.005)
    return True


@pytest.fixture
def no_loop_crash(caplog):
    """Fails the test if a session's trio loop crashed (the old 'Nursery stack corrupted')."""
    caplog.set_level(logging.ERROR, logger="flowrt.trio_thread")
    yield
    assert [r.getMessage() for r in caplog.records if r.name == "flowrt.trio_thread"] == []


def test_close_calls_back_a_pending_run_with_a_closed_error(no_loop_crash):
    with gated_model() as (opt, gate):
        session = flowrt.InferenceSession(opt, cpu_workers=1)  # one pool: "b" waits for "a"
        loop_thread = session._thread._thread
        callbacks = Callbacks()
        session.run_async(None, ONE, callbacks, "a")
        assert gate.wait_started()
        session.run_async(None, ONE, callbacks, "b")
        closer, _ = _in_thread(session.close)
        # "b" hears of the close while "a" still holds the session's only pool.
        assert callbacks.wait_for("b")
        assert callbacks.calls["b"] == [(None, CLOSED_CALLBACK_ERROR)]
        gate.release()
        closer.join(10)
    assert not closer.is_alive()
    assert not loop_thread.is_alive()
    # "a" was cancelled as its workload ended; called back once all the same.
    assert callbacks.calls["a"] == [(None, CLOSED_CALLBACK_ERROR)]


def test_a_thread_inside_run_gets_a_closed_error_when_the_session_closes(no_loop_crash):
    with gated_model() as (opt, gate):
        session = flowrt.InferenceSession(opt, cpu_workers=1)
        first, first_outcome = _in_thread(session.run, None, ONE)
        assert gate.wait_started()
        second, second_outcome = _in_thread(session.run, None, ONE)  # waits for the only pool
        # Close only once the second call is a task of the loop; before, it is refused instead.
        assert _within(10, lambda: len(session._thread._nursery.child_tasks) == 2)
        closer, _ = _in_thread(session.close)
        second.join(10)
        assert not second.is_alive()
        gate.release()
        first.join(10)
        closer.join(10)
    assert not closer.is_alive() and not session._thread.alive
    for outcome in (first_outcome, second_outcome):
        (error,) = outcome
        assert isinstance(error, FlowrtError)
        assert "InferenceSession was closed while the call ran" in str(error)
    with pytest.raises(FlowrtError, match="this InferenceSession is closed"):
        session.run(None, ONE)


def test_close_from_several_threads_at_once_returns_in_each_and_calls_every_callback_once(
    no_loop_crash,
):
    session = flowrt.InferenceSession(branchy_network(), backends=["CpuRef"])
    callbacks = Callbacks()
    for i in range(40):
        session.run_async(None, {"x": np.full((2, 4), i, np.float32)}, callbacks, i)
    barrier = threading.Barrier(4)
    closers = [_in_thread(lambda: (barrier.wait(), session.close()))[0] for _ in range(4)]
    for closer in closers:
        closer.join(10)
    assert not any(c.is_alive() for c in closers)
    assert not session._thread.alive
    assert sorted(callbacks.calls) == list(range(40))
    for calls in callbacks.calls.values():
        ((outputs, error),) = calls
        assert error in ("", CLOSED_CALLBACK_ERROR)
        assert (outputs is None) == bool(error)
    session.close()  # and again, once closed


def test_a_session_dropped_with_runs_pending_calls_back_and_ends_its_thread(no_loop_crash):
    session = flowrt.InferenceSession(branchy_network(), backends=["CpuRef"])
    loop_thread = session._thread._thread
    callbacks = Callbacks()
    for i in range(10):
        session.run_async(None, {"x": np.ones((1, 4), np.float32)}, callbacks, i)
    del session
    gc.collect()
    loop_thread.join(10)
    assert not loop_thread.is_alive()
    assert sorted(callbacks.calls) == list(range(10))


def test_interpreter_exit_with_runs_pending_calls_every_callback_and_prints_no_traceback():
    script = textwrap.dedent(
        """
        import sys
        import numpy as np
        sys.path.insert(0, {tests!r})
        from netbuild import branchy_network
        import flowrt

        session = flowrt.InferenceSession(branchy_network(), backends=["CpuRef"])
        x = {{"x": np.ones((1, 4), np.float32)}}

        def callback(outputs, i, error):  # one write per line: callbacks run in several threads
            sys.stdout.write(f"called {{i}} {{error or 'ok'}}\\n")

        for i in range(30):
            session.run_async(None, x, callback, i)
        """
    ).format(tests=str(Path(__file__).parent))
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr and "Nursery" not in done.stderr, done.stderr
    called = sorted(int(line.split()[1]) for line in done.stdout.splitlines())
    assert called == list(range(30))
    assert all(line.endswith(("ok", "finished")) for line in done.stdout.splitlines())
