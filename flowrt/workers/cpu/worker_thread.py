"""A CPU worker actor's thread (``workers.CpuWorkerPool`` makes them), and what the job it
runs may ask of it: its share of the cores between two workloads (``share_cores``), its
context (``job_context``), and the signal that tells work running many workloads in one
native call to come back to Python for those (``job_signal``, ``attend``). See
``workers.py`` for the rules.
"""

from __future__ import annotations

import logging
import os
import queue
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import attrs
import numpy as np
import outcome
import trio

from flowrt.engine.scheduler.job import JobContext
from flowrt.types import Priority
from flowrt.workers.cpu import blas_threads

if TYPE_CHECKING:
    from flowrt.workers.cpu.workers import CpuWorkerPool

logger = logging.getLogger(__name__)


@attrs.frozen
class _Job:
    """What a worker is handed: the call, the threads of its parallel regions, the nice value
    to add while it runs, and how to report back into trio."""

    fn: Callable[..., Any]
    args: tuple[Any, ...]
    priority: int
    may_pause: float  # seconds it may pause for HIGH work
    cancelled: threading.Event  # set when its caller is cancelled: it pauses no more
    threads: int
    nice: int
    token: trio.lowlevel.TrioToken
    deliver: Callable[[outcome.Outcome], None]


# The job a worker thread runs now, for ``share_cores``; ``own`` is any worker's (reserve
# ones too), for ``job_signal`` and ``attend``.
_current = threading.local()
_NO_SIGNAL = np.zeros(1, np.int64)  # off the workers: never set

# Called on the worker's thread after each job, in order (CpuAcc's team adds its watch for
# other processes, ``acc/contention.py``): quick, and raising nothing.
AFTER_JOB: list[Callable[[], None]] = []


def share_cores() -> JobContext | None:
    """Between two workloads of a job on a CPU worker: pause while HIGH jobs run, if this one
    is of lower priority, then use no more threads than the job's share of the cores now (see
    the module doc); return the job's context now, for the next workload. Elsewhere (None),
    and for reserve jobs (also None: they keep every thread), it does nothing."""
    worker = getattr(_current, "worker", None)
    if worker is None:
        return None
    worker.share_cores()
    return worker.context


def job_signal() -> np.ndarray:
    """The word that tells the job running on this CPU worker to come back to Python at its
    next workload boundary (non-zero: its share of the cores shrank, HIGH work wants the
    cores, or its caller was cancelled), for work that runs many workloads in one native call
    and checks it between them (CpuAcc's recorded layers); off the workers, a word never set."""
    worker = getattr(_current, "own", None)
    return _NO_SIGNAL if worker is None else worker.signal


def attend() -> bool:
    """On a CPU worker whose job's signal (``job_signal``) was set: the signal cleared, then
    what ``share_cores`` does between two workloads; whether the job goes on (its caller was
    not cancelled)."""
    worker = getattr(_current, "own", None)
    if worker is None:
        return True
    worker.signal[0] = 0
    if worker.pool is not None:
        worker.share_cores()
    return not worker.cancelled.is_set()


def job_context() -> JobContext | None:
    """The context of the job running on this CPU worker now, without sharing the cores again
    (as a load's warm-up of its kernels needs it); None off the workers and on reserve ones (a
    worker thread runs nothing but its jobs)."""
    worker = getattr(_current, "worker", None)
    return None if worker is None else worker.context


class _Worker:
    """One thread serving its inbox until it receives ``None``. A regular worker has its
    pool: ``pool.busy(priority)`` counts the jobs a job of that priority shares the cores
    with, and ``pool.high_jobs`` the HIGH jobs running, which ``pool.high_changed`` is
    notified of when they end (all read from this thread: the pool changes them in trio's).
    Reserve workers have none."""

    def __init__(self, name: str, threads: int, pool: CpuWorkerPool | None = None) -> None:
        self.inbox: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self.threads = threads
        self.pool = pool
        self.thread = threading.Thread(target=self._serve, name=name, daemon=True)
        self.ready = threading.Event()
        self.threads_now = threads  # numba's thread count on this thread
        self.context = JobContext(threads)  # the running job's, as the kernels are told it
        self.priority = int(Priority.MEDIUM)  # the running job's
        self.pause_left = 0.0  # seconds the running job may still pause for HIGH work
        self.cancelled = threading.Event()  # the running job's
        # See job_signal. Not cleared as a job starts: a job started just before, beside
        # this one, may have set it for this one; a word left from the last job costs one
        # look at the share of the cores.
        self.signal = np.zeros(1, np.int64)

    def _serve(self) -> None:
        import numba  # imported, and its threading layer chosen, by the pool (see the module doc)

        # numba's thread count is per calling thread: kernels split their windows into
        # slices, and this caps how many threads run a worker's slices at once.
        numba.set_num_threads(self.threads)
        if self.pool is not None:
            _current.worker = self
        _current.own = self
        self.ready.set()
        while (job := self.inbox.get()) is not None:
            self._set_threads(job.threads)
            self.priority, self.pause_left, self.cancelled = job.priority, job.may_pause, job.cancelled
            blas_threads.begin_job()
            try:
                result = self._run(job)
            finally:
                blas_threads.end_job()
            job.token.run_sync_soon(job.deliver, result)
            for hook in AFTER_JOB:
                hook()

    def _set_threads(self, threads: int) -> None:
        if threads != self.threads_now:
            import numba  # loaded by the pool already: a look-up

            numba.set_num_threads(threads)
            self.threads_now = threads
            self.context = JobContext(threads)

    def share_cores(self) -> None:
        """Pause while HIGH jobs run (if this job's priority is lower and it may still pause),
        then step down to the job's share of the cores, when others started beside it."""
        pool = self.pool
        assert pool is not None
        if self.pause_left > 0 and pool.high_jobs and not self.cancelled.is_set():
            began = time.monotonic()
            with pool.high_changed:
                pool.high_changed.wait_for(
                    lambda: not pool.high_jobs or self.cancelled.is_set(), self.pause_left
                )
            self.pause_left -= time.monotonic() - began
        share = max(1, self.threads // max(1, pool.busy(self.priority)))
        if share < self.threads_now:
            self._set_threads(share)

    @staticmethod
    def _run(job: _Job) -> outcome.Outcome:
        if not job.nice:
            return outcome.capture(job.fn, *job.args)
        thread = threading.get_native_id()
        try:
            base = os.getpriority(os.PRIO_PROCESS, thread)
            os.setpriority(os.PRIO_PROCESS, thread, min(base + job.nice, 19))
        except OSError as e:  # the job runs all the same, at the thread's nice value
            logger.info("a LOW job runs without stepping back: %s", e)
            return outcome.capture(job.fn, *job.args)
        try:
            return outcome.capture(job.fn, *job.args)
        finally:
            try:
                os.setpriority(os.PRIO_PROCESS, thread, base)
            except OSError as e:
                logger.warning("worker thread %d keeps the nice +%d of a LOW job: %s", thread, job.nice, e)
