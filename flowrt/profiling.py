"""Profiling runs: one record per workload, and Chrome-trace output for Perfetto/chrome://tracing.

::

    outputs = await model.run(feeds, profile=True)
    flowrt.profiling.write_chrome_trace(model.profile(), "trace.json")
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Sequence

import attrs


@attrs.frozen
class ProfileRecord:
    """One workload's execution in one run. Times are ``time.perf_counter_ns()`` values."""

    run: int
    layer: str
    kind: str
    backend: str
    worker: str
    start_ns: int
    end_ns: int
    slices: int = 1
    launches: int = 0  # the kernels a device workload enqueued (0 on the host)

    @property
    def duration_ns(self) -> int:
        return self.end_ns - self.start_ns


def chrome_trace(records: Sequence[ProfileRecord]) -> dict:
    """The Chrome trace-event JSON object: one complete event per workload, one track (tid)
    per worker, timestamps in microseconds from the first record."""
    origin = min((r.start_ns for r in records), default=0)
    workers = {name: tid for tid, name in enumerate(dict.fromkeys(r.worker for r in records), start=1)}
    pid = os.getpid()
    events: list[dict] = [
        {"name": "thread_name", "ph": "M", "pid": pid, "tid": tid, "args": {"name": name}}
        for name, tid in workers.items()
    ]
    for r in records:
        events.append(
            {
                "name": r.layer,
                "cat": r.backend,
                "ph": "X",
                "ts": (r.start_ns - origin) / 1e3,
                "dur": r.duration_ns / 1e3,
                "pid": pid,
                "tid": workers[r.worker],
                "args": {
                    "kind": r.kind,
                    "backend": r.backend,
                    "run": r.run,
                    "slices": r.slices,
                    "launches": r.launches,
                },
            }
        )
    return {"traceEvents": events, "displayTimeUnit": "ms"}


def write_chrome_trace(records: Sequence[ProfileRecord], path: str | os.PathLike) -> None:
    """Write ``records`` as a Chrome trace JSON file."""
    with open(path, "w") as f:
        json.dump(chrome_trace(records), f)


def top_layers(records: Iterable[ProfileRecord], count: int = 10) -> list[tuple[str, str, float, int]]:
    """(layer, kind, total milliseconds, calls) of the layers that took longest, slowest first."""
    totals: dict[str, list] = {}
    for r in records:
        entry = totals.setdefault(r.layer, [r.kind, 0, 0])
        entry[1] += r.duration_ns
        entry[2] += 1
    ranked = sorted(totals.items(), key=lambda item: -item[1][1])[:count]
    return [(layer, kind, ns / 1e6, calls) for layer, (kind, ns, calls) in ranked]
