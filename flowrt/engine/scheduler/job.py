"""What a host job tells the workloads it runs about itself, now.

A host segment runs as one job on a CPU worker (``flowrt.workers.cpu.workers``); the threads it
may use change while it runs (it steps down when other runs start beside it). Before each
workload the host runner hands the executor the job's :class:`JobContext`, and the executor
passes it to the workloads that ask for one (``takes_job``: ``execute(inputs, outputs,
job)``), so that a kernel which plans its split per call splits by the threads it has now.
"""

from __future__ import annotations

import attrs


@attrs.frozen
class JobContext:
    """The running job as it is now: ``threads``, its share of the cores, as many as its
    parallel regions use (a run sharing the cores with others has one)."""

    threads: int
