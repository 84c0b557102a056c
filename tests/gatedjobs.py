"""Fake CPU worker jobs that the test starts and ends, shared by the worker pool's tests."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import trio

from flowrt.types import Priority
from flowrt.workers.cpu.workers import CpuWorkerPool


class GatedJobs:
    """Fake jobs: each one holds its worker until the test releases it, and tells trio (in
    trio time) when it starts, so the test decides how long every job takes."""

    def __init__(self) -> None:
        self.started: list[tuple[str, float]] = []
        self._gates: dict[str, threading.Event] = {}
        self._token = trio.lowlevel.current_trio_token()
        self._changed = trio.Event()

    @property
    def order(self) -> list[str]:
        return [name for name, _ in self.started]

    def job(self, name: str) -> Callable[[], str]:
        gate = self._gates[name] = threading.Event()

        def run() -> str:
            self._token.run_sync_soon(self._on_start, name)
            if not gate.wait(timeout=30):
                raise TimeoutError(f"job {name!r} was never released")
            return name

        return run

    def _on_start(self, name: str) -> None:
        self.started.append((name, trio.current_time()))
        self._changed.set()
        self._changed = trio.Event()

    async def run(self, pool: CpuWorkerPool, name: str, priority: Priority = Priority.MEDIUM) -> str:
        return await pool.run_sync(self.job(name), priority=priority)

    async def wait_started(self, count: int) -> None:
        """Until ``count`` jobs have started."""
        while len(self.started) < count:
            await self._changed.wait()

    async def wait_started_within(self, name: str, seconds: float) -> bool:
        """Whether job ``name`` starts within ``seconds`` of real time. On trio's autojump
        clock a wait in trio time ends before a worker thread has had a chance to run."""
        deadline = time.monotonic() + seconds
        while name not in self.order and time.monotonic() < deadline:
            await trio.to_thread.run_sync(time.sleep, 0.005)
        return name in self.order

    def release(self, name: str) -> None:
        self._gates[name].set()

    def release_all(self) -> None:
        for gate in self._gates.values():
            gate.set()
