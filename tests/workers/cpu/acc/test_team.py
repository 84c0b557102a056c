"""CpuAcc's team of spinning helpers (``team.py``): every task of a region runs once, whoever
takes it; busy, raising, forked and switched off, regions still run, on numba's layer."""

import ctypes
import multiprocessing
import os
import platform
import subprocess
import sys
import threading
import time

import numba
import numpy as np
import pytest
from numba import njit

from flowrt.workers.cpu.acc import calls, team
from flowrt.workers.cpu.acc.calls import NATIVE, SliceFunction
from flowrt.workers.cpu.acc.kernels import cast

pytestmark = pytest.mark.skipif(
    not team.SUPPORTED or calls.default_cpu_workers() < 2, reason="no team here: one core, or not Linux"
)


def _cast(size: int, tasks: int) -> bool:
    """float32 -> float64 over ``tasks`` slices (CpuAcc's Cast kernel): whether every element
    came out right."""
    x = np.arange(size, dtype=np.float32)
    out = np.full(size, -1.0)
    cast._cast(x, out, np.linspace(0, size, tasks + 1).astype(np.int64))
    return bool((out == x).all())


def _with_threads(threads: int, fn):
    before = numba.get_num_threads()
    numba.set_num_threads(threads)
    try:
        return fn()
    finally:
        numba.set_num_threads(before)


def test_regions_of_two_threads_run_on_the_team_and_every_task_once():
    assert _cast(10, 1)  # the first launch starts the team
    assert team.helpers() >= 1
    before = team.regions()
    assert _with_threads(2, lambda: all(_cast(4096, tasks) for tasks in range(2, 10) for _ in range(50)))
    assert team.regions() - before == 8 * 50


def test_a_thread_of_one_thread_runs_its_tasks_alone():
    _cast(10, 1)
    before = team.regions()
    assert _with_threads(1, lambda: _cast(4096, 4))
    assert team.regions() == before


def test_callers_on_several_threads_at_once_share_the_team_or_run_on_numbas_layer():
    _cast(10, 1)
    failures = []

    def caller(seed):
        numba.set_num_threads(2)
        rng = np.random.default_rng(seed)
        for _ in range(2000):
            if not _cast(int(rng.integers(2, 5000)), int(rng.integers(1, 9))):
                failures.append(seed)

    threads = [threading.Thread(target=caller, args=(seed,)) for seed in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert not any(thread.is_alive() for thread in threads)
    assert failures == []


@njit(**NATIVE)
def _count_or_raise(task, _step, counts, failing):
    counts[task] += 1
    if task == failing:
        raise ValueError("this task fails")


_COUNT_OR_RAISE = SliceFunction(_count_or_raise)


@pytest.mark.parametrize("failing", [0, 1, 3])
def test_a_task_that_raises_raises_in_the_caller_and_leaves_the_team_free(failing):
    """Whichever thread ran it, the caller's or a helper: the others' tasks ran, the failed
    one ran again on the caller to raise there."""
    _cast(10, 1)
    counts = np.zeros(4, np.int64)
    with pytest.raises(ValueError, match="this task fails"):
        _with_threads(2, lambda: _COUNT_OR_RAISE.run(4, (counts, np.int64(failing))))
    assert counts.tolist() == [2 if task == failing else 1 for task in range(4)]
    assert team.CONTROL[team.OWNER] == 0
    counts[:] = 0
    _with_threads(2, lambda: _COUNT_OR_RAISE.run(4, (counts, np.int64(-1))))
    assert counts.tolist() == [1, 1, 1, 1]


_SYSCALL = ctypes.CDLL(None).syscall
_SYSCALL.restype, _SYSCALL.argtypes = ctypes.c_long, [ctypes.c_long]
_GETTID = {"x86_64": 186, "aarch64": 178}.get(platform.machine(), -1)


# Not cached: numba does not cache a function that calls through ctypes.
@njit(nogil=True, no_cpython_wrapper=True, no_cfunc_wrapper=True)
def _record_thread(task, _step, threads):
    threads[task] = _SYSCALL(_GETTID)


_RECORD_THREAD = SliceFunction(_record_thread)


def test_the_caller_takes_tasks_from_the_front_and_helpers_from_the_back():
    """The caller's tasks are a prefix of the region's (task 0 first), a helper's a suffix:
    region after region each thread does the same part where the helper comes in time."""
    _cast(10, 1)
    caller = threading.get_native_id()
    helper_took_the_last = regions = 0
    # at least 200 regions, more (for up to 10 s) until a helper came in time for one: a
    # helper asleep as the loop starts may first be woken on the caller's core, and 200
    # regions of a few microseconds end before the OS runs it (then moves it)
    deadline = time.monotonic() + 10
    while regions < 200 or (not helper_took_the_last and time.monotonic() < deadline):
        regions += 1
        threads = np.zeros(6, np.int64)
        _with_threads(2, lambda threads=threads: _RECORD_THREAD.run(6, (threads,)))
        ours = (threads == caller).tolist()
        assert all(threads != 0)
        taken = ours.count(True)
        assert ours == [True] * taken + [False] * (6 - taken), threads
        helper_took_the_last += not ours[-1]
    assert helper_took_the_last > 0


def _forked_child(queue):
    queue.put((_cast(4096, 2), team.helpers(), int(team.CONTROL[team.DISABLED])))


def test_a_forked_child_runs_its_regions_on_numbas_layer():
    assert _cast(4096, 2)
    context = multiprocessing.get_context("fork")
    queue = context.Queue()
    child = context.Process(target=_forked_child, args=(queue,))
    child.start()
    result = queue.get(timeout=120)
    child.join(timeout=60)
    assert child.exitcode == 0
    assert result == (True, 0, 1)


# A process of four threads (numba's and the team's): regions of 2 to 4 threads from three
# callers at once, then after the helpers have gone to sleep.
_FOUR = """
import threading, time
import numba, numpy as np
from flowrt.workers.cpu.acc import team
team.start(4)
from flowrt.workers.cpu.acc.kernels import cast

failures = []
def caller(seed):
    numba.set_num_threads(2 + seed % 3)
    rng = np.random.default_rng(seed)
    for i in range(3000):
        size, tasks = int(rng.integers(2, 5000)), int(rng.integers(1, 9))
        x = np.arange(size, dtype=np.float32)
        out = np.full(size, -1.0)
        cast._cast(x, out, np.linspace(0, size, tasks + 1).astype(np.int64))
        if not (out == x).all():
            failures.append((seed, i))
        if i % 500 == 0:
            time.sleep(0.002)  # past the helpers' spin: they sleep, the next region wakes them
threads = [threading.Thread(target=caller, args=(seed,)) for seed in range(3)]
for t in threads:
    t.start()
for t in threads:
    t.join()
print(team.helpers(), team.regions() > 0, len(failures))
"""


def test_a_team_of_three_helpers_runs_every_task_once():
    env = {**os.environ, "NUMBA_NUM_THREADS": "4"}
    done = subprocess.run([sys.executable, "-c", _FOUR], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["3", "True", "0"]


def test_flowrt_cpu_spin_0_leaves_regions_to_numbas_layer():
    script = "from flowrt.workers.cpu.acc import team\nfrom flowrt.workers.cpu.acc.kernels import cast\n"
    script += "import numpy as np\nx = np.arange(100, dtype=np.float32); out = np.zeros(100)\n"
    script += (
        "cast._cast(x, out, np.array([0, 50, 100]))\nprint(team.helpers(), team.regions(), (out == x).all())"
    )
    env = {**os.environ, "FLOWRT_CPU_SPIN": "0"}
    done = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["0", "0", "True"]


def test_flowrt_backends_says_what_the_team_is(capsys, monkeypatch):
    from flowrt.cli import main

    assert main(["backends"]) == 0
    helpers = calls.default_cpu_workers() - 1
    assert f"CpuAcc's team: {helpers} helper thread" in capsys.readouterr().out
    monkeypatch.setenv("FLOWRT_CPU_SPIN", "0")
    assert main(["backends"]) == 0
    assert "CpuAcc's team: off: FLOWRT_CPU_SPIN=0" in capsys.readouterr().out
