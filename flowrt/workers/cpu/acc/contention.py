"""Whether another process keeps the cores busy, for CpuAcc's team (``team.py``).

Alone on its cores, a helper spins between regions and yields the core every few pauses, in
case a thread wants it. Beside a busy process that costs it most regions: on Linux's EEVDF
scheduler a yield beside a busy thread often hands that thread the core for a whole slice
(milliseconds), so the helper is off the core as regions start and the caller runs every
task (resnet50 beside one busy core: the helper had 0.09 of a core, the run took 40-48 ms
against 21 alone). Sleeping as soon as a region ends instead, woken by the caller at the
next one, puts it back on a core as each region starts (30-33 ms, as ONNX Runtime's pool
fares), but alone costs a wake-up a region (resnet50 +6%, mobilenet_v2 and resnet18 +10%).
So the team sleeps at once only while another process is there (``team.CONTENDED``).

Which it is, :func:`observe` decides after each job on a CPU worker. The symptom: most of
the regions since it last looked ran with no helper joining in time (``team.MISSED``).
That alone does not say who took the helper's core, which may be a thread of this process
(another engine's pool, a Python thread): then nothing is gained by sleeping. So a symptom
leads to a look at the machine: the threads running or waiting for a core, all of them
(``/proc/loadavg``) less this process's (state R in ``/proc/self/task``); another process
is there when those and the team's threads are more than the cores. Two looks in a row
must agree to change the state, either way: a process that runs for a moment (a daemon's)
does not make the team sleep, nor one look that counts a thread wrong wake it. Looked at
most every ``CHECK_EVERY_S`` (a look costs about 0.1 ms); from a first look that finds
another process until two find none, every ``CHECK_EVERY_S`` whatever the symptom.
"""

from __future__ import annotations

import os
import threading
import time

from flowrt.workers.cpu.acc import team

CHECK_EVERY_S = 0.05
# Regions to see before judging them: the first region of a run often starts while the
# helper wakes from its sleep between runs.
MIN_REGIONS = 16

_lock = threading.Lock()
_seen = {"regions": 0, "missed": 0}
_next_check = 0.0
_cores = 1
_against = 0  # looks in a row that disagreed with ``team.CONTENDED``


def start(cores: int) -> None:
    """Watch for other processes on behalf of a team for ``cores`` cores (``team.start``)."""
    global _cores
    _cores = cores


def _running_here() -> int:
    """This process's threads running or waiting for a core (state R)."""
    count = 0
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/stat", "rb") as f:
                stat = f.read()
        except OSError:  # a thread that ended meanwhile
            continue
        at = stat.rfind(b")") + 2  # the state follows the command, which may hold spaces
        count += stat[at : at + 1] == b"R"
    return count


def others_running() -> int:
    """Threads of other processes running or waiting for a core now (0 where ``/proc`` does
    not tell). This process's are counted before and after the machine's, and the larger
    count taken: a thread of ours that went to sleep in between is not taken for another's."""
    try:
        before = _running_here()
        with open("/proc/loadavg", "rb") as f:
            everyone = int(f.read().split()[3].split(b"/")[0])
        ours = max(before, _running_here())
    except (OSError, ValueError, IndexError):
        return 0
    return max(0, everyone - ours)


def observe() -> None:
    """After a job on a CPU worker: set or clear ``team.CONTENDED`` where it is time to look
    (see the module doc). Cheap when not: two words read. A second worker that comes while
    one looks does not wait for it."""
    global _next_check, _against
    if not _lock.acquire(blocking=False):
        return
    try:
        control = team.CONTROL
        regions, missed = int(control[team.REGIONS]), int(control[team.MISSED])
        contended = control[team.CONTENDED] != 0
        watching = contended or _against > 0
        new_regions, new_missed = regions - _seen["regions"], missed - _seen["missed"]
        if not watching and new_regions < MIN_REGIONS:
            return
        _seen["regions"], _seen["missed"] = regions, missed
        now = time.monotonic()
        if now < _next_check or (not watching and 2 * new_missed <= new_regions):
            return
        _next_check = now + CHECK_EVERY_S
        found = others_running() + team.helpers() + 1 > _cores
        _against = _against + 1 if found != contended else 0
        if _against >= 2:
            control[team.CONTENDED], _against = int(found), 0
    finally:
        _lock.release()
