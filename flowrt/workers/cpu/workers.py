"""How many CPU workers this process has."""

from __future__ import annotations

import os


def default_cpu_workers() -> int:
    """The number of cores this process may use."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not every platform has affinity
        return os.cpu_count() or 1
