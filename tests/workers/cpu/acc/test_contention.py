"""CpuAcc's watch for other processes (``contention.py``): what it counts, when it looks, and
the team's regions while it says the cores are shared."""

import os
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
import trio

import flowrt
from flowrt.models import light_model, pattern_input
from flowrt.workers.cpu.acc import calls, contention, team
from flowrt.workers.cpu.acc.kernels import cast

pytestmark = pytest.mark.skipif(
    not team.SUPPORTED or calls.default_cpu_workers() < 2, reason="no team here: one core, or not Linux"
)

_SPIN = "import time\nend = time.monotonic() + 60\nwhile time.monotonic() < end:\n    pass\n"


def _spinners(count: int) -> list[subprocess.Popen]:
    return [subprocess.Popen([sys.executable, "-c", _SPIN]) for _ in range(count)]


def _stop(processes: list[subprocess.Popen]) -> None:
    for process in processes:
        process.kill()
    for process in processes:
        process.wait(timeout=30)


def test_another_process_running_is_counted_and_this_ones_threads_are_not():
    spinning = _spinners(1)
    try:
        time.sleep(0.5)  # started and running
        assert max(contention.others_running() for _ in range(5)) >= 1
    finally:
        _stop(spinning)
    stop = threading.Event()

    def busy():  # numpy's loop runs without the GIL: this thread is running (R) in it
        x = np.random.default_rng(0).random(1 << 20)
        while not stop.is_set():
            np.sin(x, out=x)

    ours = threading.Thread(target=busy)
    ours.start()
    try:
        time.sleep(0.2)
        # this thread and the busy one, each in state R
        assert max(contention._running_here() for _ in range(20)) >= 2
    finally:
        stop.set()
        ours.join()


@pytest.fixture
def watch(monkeypatch):
    """observe() from a clean state: the counters as they are, no look yet, not contended;
    ``looks`` counts its looks at the machine, which answer ``answer[0]`` other threads."""
    assert _cast_once()  # the team started
    _forget_the_past()
    monkeypatch.setattr(contention, "_next_check", 0.0)
    monkeypatch.setattr(contention, "_cores", 2)
    monkeypatch.setattr(contention, "CHECK_EVERY_S", 0.0)
    answer, looks = [1], []

    def others():
        looks.append(answer[0])
        return answer[0]

    monkeypatch.setattr(contention, "others_running", others)
    team.CONTROL[team.CONTENDED] = 0
    yield answer, looks
    _forget_the_past()  # the regions these tests made up


def _forget_the_past() -> None:
    """observe() from now: the regions so far seen, not contended."""
    contention._seen["regions"] = int(team.CONTROL[team.REGIONS])
    contention._seen["missed"] = int(team.CONTROL[team.MISSED])
    contention._against = 0
    team.CONTROL[team.CONTENDED] = 0


def _regions(count: int, missed: int) -> None:
    team.CONTROL[team.REGIONS] += count
    team.CONTROL[team.MISSED] += missed


def test_most_regions_missed_and_another_process_there_mean_contended(watch):
    answer, looks = watch
    _regions(contention.MIN_REGIONS - 1, contention.MIN_REGIONS - 1)
    contention.observe()
    assert looks == [] and team.CONTROL[team.CONTENDED] == 0  # too few regions to judge
    _regions(20, 2)
    contention.observe()
    assert looks == [] and team.CONTROL[team.CONTENDED] == 0  # the helpers came: no look
    _regions(20, 15)
    contention.observe()
    assert looks == [1] and team.CONTROL[team.CONTENDED] == 0  # once might be a passing process
    contention.observe()  # found once: looks again whatever the symptom
    assert looks == [1, 1] and team.CONTROL[team.CONTENDED] == 1
    contention.observe()
    assert looks == [1, 1, 1] and team.CONTROL[team.CONTENDED] == 1
    answer[0] = 0
    contention.observe()
    assert looks == [1, 1, 1, 0] and team.CONTROL[team.CONTENDED] == 1  # one look might count wrong
    answer[0] = 1
    contention.observe()
    assert looks == [1, 1, 1, 0, 1] and team.CONTROL[team.CONTENDED] == 1
    answer[0] = 0
    contention.observe()
    contention.observe()
    assert looks == [1, 1, 1, 0, 1, 0, 0] and team.CONTROL[team.CONTENDED] == 0
    contention.observe()  # no symptom since: no look
    assert looks == [1, 1, 1, 0, 1, 0, 0]


def test_regions_missed_for_this_process_own_threads_are_not_contention(watch):
    answer, looks = watch
    answer[0] = 0
    _regions(40, 40)
    contention.observe()
    assert looks == [0] and team.CONTROL[team.CONTENDED] == 0


def _cast_once(size: int = 4096, tasks: int = 2) -> bool:
    x = np.arange(size, dtype=np.float32)
    out = np.full(size, -1.0)
    cast._cast(x, out, np.linspace(0, size, tasks + 1).astype(np.int64))
    return bool((out == x).all())


def test_contended_helpers_sleep_between_regions_and_still_run_every_task_once():
    assert _cast_once()  # the team started
    team.CONTROL[team.CONTENDED] = 1
    try:
        before = team.regions()
        results = []
        for i in range(300):
            results.append(_cast_once(4096, 2 + i % 5))
            if i % 50 == 0:
                time.sleep(0.001)  # past the contended spin: asleep, woken by the next region
        assert all(results)
        assert team.regions() - before == 300
    finally:
        team.CONTROL[team.CONTENDED] = 0


def test_a_runtime_beside_busy_processes_finds_its_cores_shared():
    """Through the public API: runs beside a busy process on every core."""
    path = str(light_model("squeezenet"))

    async def main():
        async with flowrt.Runtime() as rt:
            model = await rt.load(flowrt.optimize(flowrt.onnx.load(path), backends=["CpuAcc", "CpuRef"]))
            feeds = {name: pattern_input(info) for name, info in model.inputs.items()}
            name = next(iter(model.outputs))
            expected = (await model.run(feeds))[name]
            spinning = _spinners(os.cpu_count() or 2)
            try:
                time.sleep(0.5)
                _forget_the_past()
                end = time.monotonic() + 30
                runs = 0
                while runs < 5 or (team.CONTROL[team.CONTENDED] == 0 and time.monotonic() < end):
                    got = await model.run(feeds)
                    np.testing.assert_array_equal(got[name], expected)
                    runs += 1
                return int(team.CONTROL[team.CONTENDED])
            finally:
                _stop(spinning)

    try:
        assert trio.run(main) == 1
    finally:
        _forget_the_past()
