"""A runtime whose CPU worker threads cannot all start stops and joins those it started, gives
back its dynamic backends, and raises ResourceError saying how many it wanted and started."""

import threading

import pytest
from dynbackends import assert_runs, trusted_tmp_path_fixture, write_backend  # noqa: F401

import flowrt
from flowrt.errors import ResourceError
from flowrt.registry import BackendRegistry


def _cpu_threads() -> set[str]:
    return {t.name for t in threading.enumerate() if t.name.startswith("flowrt-cpu")}


def _fail_cpu_thread_start(monkeypatch: pytest.MonkeyPatch, fail_at: int) -> None:
    """Make the ``fail_at``-th start of a flowrt-cpu-* thread raise, as the OS's thread limit does."""
    real_start = threading.Thread.start
    starts = []

    def start(thread: threading.Thread) -> None:
        if thread.name.startswith("flowrt-cpu"):
            starts.append(thread.name)
            if len(starts) == fail_at:
                raise RuntimeError("can't start new thread")
        real_start(thread)

    monkeypatch.setattr(threading.Thread, "start", start)


@pytest.mark.parametrize("fail_at", [1, 2, 4])  # 2 workers: 2 threads and 2 reserve ones for HIGH
async def test_a_runtime_whose_workers_cannot_all_start_stops_those_it_started(
    monkeypatch, trusted_tmp_path, fail_at
):
    tmp_path = trusted_tmp_path  # backend files must lie where flowrt trusts them
    before = _cpu_threads()
    write_backend(tmp_path / "backends")
    registry = BackendRegistry()
    _fail_cpu_thread_start(monkeypatch, fail_at)
    runtime = flowrt.Runtime(registry, cpu_workers=2, backend_paths=[tmp_path / "backends"])
    assert registry.is_registered("Test_Tiny")
    with pytest.raises(ResourceError) as raised:
        async with runtime:
            pytest.fail("the runtime started without its workers")
    assert f"wanted 4 threads (2 workers and 2 reserve ones for HIGH runs) and started {fail_at - 1}" in str(
        raised.value
    )
    assert "can't start new thread" in str(raised.value)
    assert _cpu_threads() == before  # every thread it started was joined
    assert not registry.is_registered("Test_Tiny")  # what it registered was given back
    monkeypatch.undo()
    async with flowrt.Runtime(cpu_workers=2) as rt:  # and the process starts the next one
        await assert_runs(rt)
    assert _cpu_threads() == before
