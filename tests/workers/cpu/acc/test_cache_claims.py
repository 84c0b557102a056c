"""Several processes compiling CpuAcc's kernels into one numba cache: one compiles an entry, the
others wait for it (a helper skips it), and claims of processes that are gone are taken over."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from types import SimpleNamespace

import pytest

from flowrt.workers.cpu.acc import cache_claims

pytestmark = pytest.mark.skipif(not cache_claims.AVAILABLE, reason="claims need fcntl (POSIX)")

# Imports numba and the package, says "ready", waits for the file named by argv[1], then
# compiles (or loads) one small function and prints its cache misses and hits.
_RACE = """
import os, sys, time
from numba import types
from flowrt.workers.cpu.acc import calls

print("ready", flush=True)
while not os.path.exists(sys.argv[1]):
    time.sleep(0.005)
calls.native_address(calls._parallel_tasks, (types.int64,) * 4)
stats = calls._parallel_tasks.stats
print(sum(stats.cache_misses.values()), sum(stats.cache_hits.values()))
"""


def test_two_processes_missing_one_entry_at_once_compile_it_once(tmp_path):
    go = tmp_path / "go"
    env = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path / "cache"))
    processes = [
        subprocess.Popen([sys.executable, "-c", _RACE, str(go)], env=env, stdout=subprocess.PIPE, text=True)
        for _ in range(2)
    ]
    for process in processes:
        assert process.stdout is not None and process.stdout.readline().strip() == "ready"
    go.touch()
    counts = [tuple(map(int, process.communicate(timeout=120)[0].split())) for process in processes]
    assert all(process.returncode == 0 for process in processes)
    assert sorted(counts) == [(0, 1), (1, 0)]  # one compiled it, the other loaded what it saved
    assert not list((tmp_path / "cache").rglob("*.claim"))


class _FakeCache:
    """What the claims read of numba's Cache: the index key, the directory, the index name."""

    def __init__(self, directory) -> None:
        self.cache_path = str(directory)
        self._cache_file = SimpleNamespace(_index_name="kernel-1.py311.nbi")

    def _index_key(self, sig, codegen):
        return (sig, codegen)


_CONTEXT = SimpleNamespace(codegen=lambda: "codegen")


def _claim_of(tmp_path, sig="sig"):
    return cache_claims._claim_path(_FakeCache(tmp_path), sig, _CONTEXT)


@pytest.fixture
def sleeper():
    process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    yield process
    process.kill()
    process.wait()


def test_an_entry_claimed_by_a_live_process_is_waited_for(tmp_path, sleeper, monkeypatch):
    monkeypatch.setattr(cache_claims, "_POLL", 0.001)
    with open(_claim_of(tmp_path), "w") as f:
        f.write(str(sleeper.pid))
    loads = []

    def load(cache, sig, context):  # the entry appears at the third look
        loads.append(sig)
        return "entry" if len(loads) >= 3 else None

    assert cache_claims._claim_or_wait(_FakeCache(tmp_path), "sig", _CONTEXT, load) == "entry"
    assert len(loads) == 3


def test_a_helper_skips_an_entry_claimed_by_a_live_process(tmp_path, sleeper, monkeypatch):
    monkeypatch.setattr(cache_claims._state, "helper", True)
    with open(_claim_of(tmp_path), "w") as f:
        f.write(str(sleeper.pid))
    with pytest.raises(cache_claims.Claimed, match="being compiled by another process"):
        cache_claims._claim_or_wait(_FakeCache(tmp_path), "sig", _CONTEXT, lambda *a: None)


def test_a_claim_of_a_process_that_is_gone_is_taken_over_and_released(tmp_path, monkeypatch):
    gone = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
    path = _claim_of(tmp_path)
    with open(path, "w") as f:
        f.write(gone.stdout.strip())
    started = []
    monkeypatch.setattr(cache_claims._state, "on_compile", lambda: started.append(True))
    assert cache_claims._claim_or_wait(_FakeCache(tmp_path), "sig", _CONTEXT, lambda *a: None) is None
    with open(path) as f:
        assert int(f.read()) == os.getpid()  # ours now: the caller compiles
    assert started == [True]  # the first compile of this process calls on_compile, once
    assert cache_claims._state.on_compile is None
    cache_claims.release_all()
    assert not os.path.exists(path)


def test_a_claim_older_than_the_limit_is_taken_over(tmp_path, sleeper):
    path = _claim_of(tmp_path)
    with open(path, "w") as f:
        f.write(str(sleeper.pid))
    old = time.time() - cache_claims.STALE_AFTER - 1
    os.utime(path, (old, old))
    assert cache_claims._claim_or_wait(_FakeCache(tmp_path), "sig", _CONTEXT, lambda *a: None) is None
    cache_claims.release_all()


def test_release_all_leaves_claims_of_other_processes(tmp_path, sleeper):
    theirs = _claim_of(tmp_path, "theirs")
    with open(theirs, "w") as f:
        f.write(str(sleeper.pid))
    cache_claims._state.held[(0, "theirs")] = theirs
    cache_claims.release_all()
    assert os.path.exists(theirs)


def test_a_claim_appears_with_its_pid_inside_and_leaves_nothing_else(tmp_path, monkeypatch):
    seen = []
    link = os.link

    def watching_link(source, target):  # what another process could read the moment it appears
        link(source, target)
        with open(target) as f:
            seen.append(f.read())

    monkeypatch.setattr(cache_claims.os, "link", watching_link)
    path = _claim_of(tmp_path)
    assert cache_claims._take(path)
    assert seen == [str(os.getpid())]
    assert sorted(os.listdir(tmp_path)) == [os.path.basename(path)]
