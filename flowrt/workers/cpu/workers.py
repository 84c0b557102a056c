"""CPU worker actors: long-lived threads that run segments of workloads for trio.

A worker is a thread with an inbox. ``await pool.run_sync(fn, *args)`` waits for an idle
worker (first come, first served), hands it ``fn`` and waits for the result without blocking
trio; the worker reports back once, through the trio token. Crossing threads costs about
200 µs on small machines, so callers hand over a whole segment of workloads at a time; the
parallelism inside a kernel comes from its window split (numba parallel regions), not from
more crossings.

The pool's threads are started by ``async with CpuWorkerPool(n)`` (the ``Runtime`` does it)
and stopped, and joined, when that block ends.
"""

from __future__ import annotations

import os
import queue
import threading
from collections.abc import Callable
from typing import Any

import numba
import outcome
import trio

from flowrt.errors import FlowrtError


def default_cpu_workers() -> int:
    """The number of cores this process may use."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not every platform has affinity
        return os.cpu_count() or 1


class _Worker:
    """One thread serving its inbox until it receives ``None``; the numba parallel regions it
    enters use ``threads`` threads."""

    def __init__(self, name: str, threads: int) -> None:
        self.inbox: queue.SimpleQueue = queue.SimpleQueue()
        self.threads = threads
        self.thread = threading.Thread(target=self._serve, name=name, daemon=True)

    def _serve(self) -> None:
        # numba's thread count is per calling thread: kernels split their windows into
        # slices, and this caps how many threads run a worker's slices at once.
        numba.set_num_threads(min(self.threads, numba.config.NUMBA_NUM_THREADS))
        while (job := self.inbox.get()) is not None:
            fn, args, token, deliver = job
            result = outcome.capture(fn, *args)
            token.run_sync_soon(deliver, result)


class CpuWorkerPool:
    """``count`` worker actors; ``run_sync`` runs a blocking function on an idle one."""

    def __init__(self, count: int) -> None:
        if count < 1:
            raise ValueError(f"a worker pool needs at least one worker, got {count}")
        self.count = count
        self._workers = [_Worker(f"flowrt-cpu-{i}", count) for i in range(count)]
        self._idle_send, self._idle_receive = trio.open_memory_channel[_Worker](count)
        self._started = False

    async def __aenter__(self) -> CpuWorkerPool:
        for worker in self._workers:
            worker.thread.start()
            self._idle_send.send_nowait(worker)
        self._started = True
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        self._started = False
        for worker in self._workers:
            worker.inbox.put(None)
        # Every job finishes before its caller returns, so the workers are idle by now.
        await trio.to_thread.run_sync(self._join)

    def _join(self) -> None:
        for worker in self._workers:
            worker.thread.join()

    async def run_sync(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Run ``fn(*args)`` on an idle worker and return its result (or raise its exception).

        Waiting for an idle worker can be cancelled; once ``fn`` has started, the call waits
        for it to finish even when cancelled (``fn`` must notice a stop flag of its own to
        end early), so nothing it uses is released while it still runs.
        """
        if not self._started:
            raise FlowrtError(
                "the CPU workers are not running: run a model inside the 'async with Runtime()' "
                "block that loaded it"
            )
        worker = await self._idle_receive.receive()
        done = trio.Event()
        box: list[outcome.Outcome] = []

        def deliver(result: outcome.Outcome) -> None:
            box.append(result)
            done.set()

        try:
            worker.inbox.put((fn, args, trio.lowlevel.current_trio_token(), deliver))
            with trio.CancelScope(shield=True):
                await done.wait()
        finally:
            self._idle_send.send_nowait(worker)
        return box[0].unwrap()
