"""CPU worker actors: long-lived threads that run segments of workloads for trio.

A worker is a thread with an inbox. ``await pool.run_sync(fn, *args, priority=...)`` waits
for an idle worker, hands it ``fn`` and waits for the result without blocking trio; the
worker reports back once, through the trio token, and is lent again right there: the job of
the call waiting next starts before any task runs (and trio's thread lets it have the GIL),
so that a busy stream keeps its workers busy. Crossing threads costs about 200 µs on
small machines, so callers hand over a whole segment of workloads at a time; the parallelism
inside a kernel comes from its window split (numba parallel regions), not from more
crossings. Models loaded in one runtime share these workers: this is where their runs meet.

Priorities, as four rules:

- Waiting: idle workers are lent as memory pools are (``flowrt.engine.memory.lending``):
  the waiting call of the highest priority first, first come first served within one, and a
  waiting call gains one level per ``aging_interval`` seconds, so LOW is never starved.
- HIGH never queues behind running work of lower priority: a HIGH call that finds every
  worker busy, some with lower-priority jobs, runs at once on one of ``count`` reserve
  workers kept for that (as GpuAcc gives HIGH a queue of its own).
- HIGH has the cores: while a HIGH job runs (on any worker), jobs of lower priority pause at
  their next workload boundary, and HIGH jobs share the cores among themselves only. Kernels
  are not pre-empted, so a HIGH run waits at most for the lower jobs' current workloads;
  without the pause it would share the cores (and their OpenMP barriers) with them for its
  whole run. The aging rule bounds the pause: a job waits for a worker and then pauses for at
  most ``aging_interval`` seconds per level below HIGH in all, so a steady flow of HIGH work
  slows LOW work but never stops it; a job whose caller is cancelled stops pausing at once.
- LOW yields the cores: where the OS lets a thread lower its nice value again (Linux, with
  CAP_SYS_NICE or a permissive RLIMIT_NICE), a LOW job that runs on one thread does so at
  nice +``LOW_PRIORITY_NICE``, so that the OS gives the cores to the others first.

Intra-op threads adapt to the load: a job's numba parallel regions use ``threads // busy``
threads (at least one), ``busy`` counting the workers running a job, this one included (for a
HIGH job, the HIGH jobs only: the others pause). A lone run spreads over every core; runs in
flight together take a core each instead of oversubscribing them (two runs of two threads
each on two cores wait at each other's barriers: one thread each streams small models about
15% faster). The share is taken when a job starts and again before each of its workloads
(``share_cores``, called by the executor; work that runs many workloads in one native call,
CpuAcc's recorded layers, looks between them at its job's signal, ``job_signal``, which the
pool sets when a job starts beside one that has more threads than its share, or HIGH work
starts beside lower work, or a caller is cancelled, and calls ``attend`` then): a run that
started alone steps down to its core as soon as another starts beside it, rather than keeping
the cores of both for the rest of the run; it does not step back up within the job (its
helper threads would wake for one layer and then spin beside the other run). Reserve jobs use every thread, the jobs around them having
paused. ``share_cores`` returns the job's :class:`~flowrt.engine.scheduler.job.JobContext`
(its threads now), which the executor hands to the kernels that plan their split per call: a
run stepped down to one thread runs a conv as one slice, with GEMMs twice as wide as two
slices' run one after the other.

numba's threading layer is TBB where the ``tbb`` package is installed (a dependency on x86-64;
see ``threading_layer.py``): a parallel region's slices are tasks that whichever threads run
take, the calling worker included, so a region never waits for a helper thread that another
process keeps off the cores. The choice is made, and numba imported, when the first pool is
made (``threading_layer.prepare``), not when flowrt is imported: it is process-wide, and it
must come before numba starts its layer, which the pool's threads do as they start. Without
TBB numba falls back to OpenMP (libgomp), and two rules keep its teams cheap:

- One team: a thread's first parallel region starts a team of helper threads that lives as
  long as that thread. Once libgomp's threads outnumber the cores it stops spinning between
  regions, and waking a sleeping helper costs tens of microseconds per kernel. So kernels run
  on the workers only, load-time warm-up included, and a lone run uses worker 0's team.
- Brief spinning: unless ``GOMP_SPINCOUNT`` is set already, ``threading_layer.prepare`` sets
  it, when the first pool is made, to about 0.3 ms of spinning (libgomp's default is about
  3 ms): long enough to bridge the gaps between the kernels of a run, short enough that idle
  helpers soon leave the cores to other work.

The pool's threads are started by ``async with CpuWorkerPool(n)`` (the ``Runtime`` does it)
and stopped, and joined, when that block ends.
"""

from __future__ import annotations

import contextvars
import functools
import logging
import os
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import outcome
import trio

from flowrt.defaults import (
    default_cpu_workers as default_cpu_workers,  # where the runtime and kernels look it up
)
from flowrt.engine.memory.lending import PriorityLender
from flowrt.errors import FlowrtError, ResourceError
from flowrt.types import Priority
from flowrt.workers.cpu import malloc_tuning, threading_layer
from flowrt.workers.cpu.worker_thread import _Job, _Worker, share_cores
from flowrt.workers.cpu.worker_thread import job_context as job_context  # where the runtime looks it up

logger = logging.getLogger(__name__)

# Seconds a pool's close waits for its threads: they are idle then, unless a run outlived the
# runtime's own bounded wait for it (see ``flowrt.loaded_network.UNLOAD_GRACE``).
JOIN_GRACE = 10.0

# CFS gives a thread of nice +10 about a tenth of the share of one at 0.
LOW_PRIORITY_NICE = 10


@functools.cache
def nice_is_reversible() -> bool:
    """Whether a thread of this process may raise its nice value and lower it again (checked
    once, in a thread of its own that then ends): where it may not, LOW jobs keep theirs."""
    if not sys.platform.startswith("linux"):  # nice is per thread on Linux only
        return False
    reversible: list[bool] = []

    def probe() -> None:
        thread = threading.get_native_id()
        try:
            base = os.getpriority(os.PRIO_PROCESS, thread)
            os.setpriority(os.PRIO_PROCESS, thread, min(base + 1, 19))
            os.setpriority(os.PRIO_PROCESS, thread, base)
            reversible.append(True)
        except OSError:
            reversible.append(False)

    prober = threading.Thread(target=probe, name="flowrt-nice-probe")
    try:
        prober.start()
    except RuntimeError as e:  # "can't start new thread"; not cached, as functools.cache keeps results only
        raise ResourceError(f"could not start a thread to probe thread priorities: {e}") from e
    prober.join()
    return reversible == [True]


class CpuWorkerPool:
    """``count`` worker actors (and ``count`` reserve ones for HIGH); ``run_sync`` runs a
    blocking function on an idle one (see the module doc for the priority rules).

    ``aging_interval``: seconds of waiting that raise a call's priority one level (and that
    a job may spend waiting for a worker and pausing for HIGH work, per level below HIGH).
    """

    def __init__(self, count: int, *, aging_interval: float = 1.0) -> None:
        if count < 1:
            raise ValueError(f"a worker pool needs at least one worker, got {count}")
        self.count = count
        self.aging_interval = aging_interval
        # Before any worker's thread starts numba's threading layer (see the module doc).
        threading_layer.prepare()
        import numba

        # A job's parallel regions never use more threads than numba has.
        self.threads = min(count, numba.config.NUMBA_NUM_THREADS)  # type: ignore[attr-defined]  # numba.config sets its options at import
        self._workers = [_Worker(f"flowrt-cpu-{i}", self.threads, self) for i in range(count)]
        self._reserve = [_Worker(f"flowrt-cpu-high-{i}", self.threads) for i in range(count)]
        self._idle: PriorityLender[_Worker] = PriorityLender(aging_interval=aging_interval)
        self._idle_reserve: list[_Worker] = []
        self._running: dict[_Worker, int] = {}  # busy (not reserve) worker -> its job's priority
        self._started_with: dict[_Worker, int] = {}  # busy (not reserve) worker -> its job's threads
        self.high_jobs = 0  # HIGH jobs running, on regular and reserve workers
        # Notified when the last HIGH job ends, or a paused job's caller is cancelled.
        self.high_changed = threading.Condition()
        self._renice = False
        self._started = False

    # The executor's hook before each workload of a host segment, on the worker running it
    # (``flowrt.engine.scheduler.executor.HostRunner``): share_cores itself, with no call around
    # it (it runs once per layer).
    between_workloads = staticmethod(share_cores)

    def busy(self, priority: int) -> int:
        """The running jobs that a job of ``priority`` shares the cores with, itself included:
        the HIGH jobs (reserve ones too) for HIGH, every regular worker's job for the others."""
        return self.high_jobs if priority <= Priority.HIGH else len(self._running)

    @property
    def idle_count(self) -> int:
        """Workers (not counting the reserve) with no job now."""
        return self._idle.free_count

    @property
    def waiting_count(self) -> int:
        """Calls waiting for an idle worker now."""
        return self._idle.waiting_count

    async def __aenter__(self) -> CpuWorkerPool:
        malloc_tuning.tune()  # before the workers' first runs take their scratch
        self._renice = LOW_PRIORITY_NICE > 0 and nice_is_reversible()
        started = self._start_threads()
        try:
            # The first call in a process starts numba's threading layer (a second or so): here,
            # rather than in the first run, and in every worker before any is lent.
            await trio.to_thread.run_sync(self._wait_ready)
        except BaseException as e:
            self._stop(started)
            if isinstance(e, RuntimeError):  # trio could not start its thread
                raise ResourceError(f"the CPU worker pool could not wait for its threads: {e}") from e
            raise
        # The last one given back is lent first: worker 0 takes the first job.
        for worker in reversed(self._workers):
            self._idle.give_back(worker)
        self._idle_reserve = self._reserve[::-1]
        self._started = True
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        """Stop every worker and join its thread, also when the block is cancelled: shielded,
        for at most ``JOIN_GRACE`` seconds (a job that never ends keeps its thread, logged)."""
        self._started = False
        for worker in self._workers + self._reserve:
            worker.inbox.put(None)
        # Every job finishes before its caller returns, so the workers are idle by now, unless
        # a run outlived the runtime's bounded wait for it. Shielded: a cancelled block must
        # not leave before its threads are joined (trio's to_thread would not even start).
        with trio.CancelScope(shield=True):
            try:
                alive = await trio.to_thread.run_sync(self._join, JOIN_GRACE)
            except RuntimeError:  # no thread can start (the interpreter is exiting)
                alive = self._join(JOIN_GRACE)
        if alive:
            logger.warning(
                "%d CPU worker thread(s) did not end within %s s of the pool's close, each still "
                "running a job: %s; each ends when its job does",
                len(alive),
                JOIN_GRACE,
                ", ".join(alive),
            )

    def _start_threads(self) -> list[_Worker]:
        """Start every worker's thread, or none: when the process cannot start one (its thread
        limit or memory reached), those started are stopped and joined, and ResourceError says
        how many were wanted."""
        workers = self._workers + self._reserve
        for started, worker in enumerate(workers):
            try:
                worker.thread.start()
            except RuntimeError as e:  # "can't start new thread"
                self._stop(workers[:started])
                raise ResourceError(
                    f"the CPU worker pool wanted {len(workers)} threads ({self.count} workers and "
                    f"{self.count} reserve ones for HIGH runs) and started {started}: {e}; ask "
                    "for fewer with Runtime(cpu_workers=...)"
                ) from e
        return workers

    @staticmethod
    def _stop(workers: list[_Worker]) -> None:
        """Stop and join the threads of ``workers``, which have no job: a pool that could not
        start. It blocks the caller's thread until each one has read its ``None`` (at most the
        second or so that numba's threading layer takes to start, on a cold start)."""
        for worker in workers:
            worker.inbox.put(None)
        for worker in workers:
            worker.thread.join()

    def _wait_ready(self) -> None:
        for worker in self._workers + self._reserve:
            worker.ready.wait()

    def _join(self, timeout: float) -> list[str]:
        """Join every worker's thread within ``timeout`` seconds in all; the names of those
        still alive."""
        deadline = time.monotonic() + timeout
        for worker in self._workers + self._reserve:
            worker.thread.join(max(0.0, deadline - time.monotonic()))
        return [w.thread.name for w in self._workers + self._reserve if w.thread.is_alive()]

    async def _borrow(self, priority: int, start: Callable[..., None]) -> None:
        """Wait for an idle worker for a call of ``priority`` and ``start(worker, reserve)`` the
        job on it as it is lent (a reserve worker for HIGH, see the module doc)."""
        if priority <= Priority.HIGH:
            await trio.sleep(0)  # a checkpoint, as taking a worker is: a cancelled call takes none
            # Decided in one step of trio: a lower-priority call must not take the idle worker
            # between this one's look and its take, leaving it to wait for a lower job's end.
            worker = self._idle.take_nowait()
            if worker is not None:
                start(worker, False)
                return
            if self._idle_reserve and any(running > priority for running in self._running.values()):
                start(self._idle_reserve.pop(), True)
                return
        await self._idle.take(priority, start)

    def _job_settings(self, priority: int, reserve: bool) -> tuple[int, int]:
        """The threads and the nice increment of a job that starts now."""
        if reserve:
            return self.threads, 0
        threads = max(1, self.threads // max(1, self.busy(priority)))
        # One thread: the job runs on the worker's own thread. The helper threads of a
        # parallel region are made once per worker and would keep a nice value given then.
        low = self._renice and priority >= Priority.LOW and threads == 1
        return threads, LOW_PRIORITY_NICE if low else 0

    def _signal_beside(self, started: _Worker, priority: int) -> None:
        """Tell the jobs running beside one of ``priority`` just started on ``started`` to come
        back to Python at their next workload boundary (``job_signal``) where it changes what
        they may use: a HIGH job pauses lower ones (those that may pause no more look and go
        on), and a job that started with more threads than its share now steps down. Only
        those: a job running natively gives the GIL up for as long as it can."""
        for other, running in self._running.items():
            if other is started:
                continue
            pauses = priority <= Priority.HIGH < running
            share = max(1, self.threads // max(1, self.busy(running)))
            if pauses or self._started_with.get(other, 1) > share:
                other.signal[0] = 1

    async def run_sync(
        self,
        fn: Callable[..., Any],
        *args: Any,
        priority: int = Priority.MEDIUM,
        on_cancel: Callable[[], None] | None = None,
    ) -> Any:
        """Run ``fn(*args)`` on an idle worker, in a copy of the caller's context (as
        ``trio.to_thread.run_sync`` does), and return its result (or raise its exception).

        While every worker is busy the call waits, by ``priority`` (see the module doc).
        Waiting can be cancelled, and a cancelled call never holds a worker; once ``fn`` has
        started, the call waits for it to finish even when cancelled, so nothing it uses is
        released while it still runs: ``on_cancel`` is called (in trio) when the call is
        cancelled then, to tell ``fn`` to end early (setting a stop flag it checks).
        """
        if not self._started:
            raise FlowrtError(
                "the CPU workers are not running: run a model inside the 'async with Runtime()' "
                "block that loaded it"
            )
        done = trio.Event()
        box: list[outcome.Outcome] = []
        lent: list[tuple[_Worker, bool]] = []
        priority = int(priority)
        # In the caller's context, as trio.to_thread runs it: context variables carry over.
        call = contextvars.copy_context().run
        token = trio.lowlevel.current_trio_token()

        def start(worker: _Worker, reserve: bool = False) -> None:
            lent.append((worker, reserve))
            if not reserve:
                self._running[worker] = priority
            if priority <= Priority.HIGH:
                self.high_jobs += 1
            threads, nice = self._job_settings(priority, reserve)
            waited = time.monotonic() - asked
            may_pause = max(0.0, (priority - Priority.HIGH) * self.aging_interval - waited)
            job = _Job(call, (fn, *args), priority, may_pause, cancelled, threads, nice, token, deliver)
            if not reserve:
                self._started_with[worker] = threads
            self._signal_beside(worker, priority)
            worker.inbox.put(job)
            # The worker wakes needing the GIL, which trio's thread keeps while it goes on
            # (0.5 ms on a stream's busy loop): hand it over now, so that the job starts.
            time.sleep(0)

        def deliver(result: outcome.Outcome) -> None:
            # In trio, as the job ends: the worker is given back, and the next waiting job
            # started on it, before this call's task runs again.
            worker, reserve = lent[0]
            if priority <= Priority.HIGH:
                self.high_jobs -= 1
                if self.high_jobs == 0:
                    with self.high_changed:
                        self.high_changed.notify_all()
            if reserve:
                self._idle_reserve.append(worker)
            else:
                self._running.pop(worker, None)
                self._started_with.pop(worker, None)
                self._idle.give_back(worker)
            box.append(result)
            done.set()

        asked, cancelled = time.monotonic(), threading.Event()
        try:
            await self._borrow(priority, start)
            await done.wait()
        except trio.Cancelled:
            if not lent:
                raise  # cancelled while waiting for a worker: it holds none
            # The result is returned all the same (as the job's outcome was, shielded): the
            # cancellation reaches the caller at its next checkpoint.
            if on_cancel is not None:
                on_cancel()
            cancelled.set()  # a job paused for HIGH work goes on to its end
            lent[0][0].signal[0] = 1  # and one running natively comes back to see it
            with self.high_changed:
                self.high_changed.notify_all()
            with trio.CancelScope(shield=True):
                await done.wait()
        return box[0].unwrap()
