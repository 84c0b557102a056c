"""glibc's malloc thresholds raised by the first CPU worker pool (``malloc_tuning.py``), in
fresh processes: mallopt is process-wide and applied once."""

import os
import platform
import subprocess
import sys

import pytest

pytestmark = pytest.mark.skipif(
    platform.system() != "Linux" or platform.libc_ver()[0] != "glibc", reason="glibc's mallopt only"
)

# A runtime is started (its CPU worker pool applies the thresholds), then a thread takes and
# frees scratch blocks of 1-12 MiB round after round, as CpuAcc's kernels do in every run.
SCRIPT = """
import resource, sys, threading, numpy as np, trio, flowrt
from flowrt.workers.cpu import malloc_tuning

async def main():
    async with flowrt.Runtime(cpu_workers=1):
        pass

trio.run(main)

def rounds(faults):
    for r in range(6):
        if r == 1:
            before = resource.getrusage(resource.RUSAGE_THREAD).ru_minflt
        for size in (3 << 20, 1 << 20, 6 << 20, 2 << 20, 12 << 20):
            block = np.empty(size // 4, np.float32)
            block[:] = 1.0
            del block
    faults.append(resource.getrusage(resource.RUSAGE_THREAD).ru_minflt - before)

faults = []
thread = threading.Thread(target=rounds, args=(faults,))
thread.start()
thread.join()
print(malloc_tuning.tune(), faults[0])
"""


def _run(**env: str) -> tuple[bool, int]:
    environ = {k: v for k, v in os.environ.items() if k not in ("GLIBC_TUNABLES", "FLOWRT_MALLOC_TUNING")}
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT], env={**environ, **env}, capture_output=True, text=True, check=True
    )
    applied, faults = done.stdout.split()
    return applied == "True", int(faults)


def test_a_worker_pool_keeps_freed_scratch_so_later_rounds_take_no_page_faults():
    assert _run() == (True, 0)


@pytest.mark.parametrize(
    "env",
    [{"FLOWRT_MALLOC_TUNING": "0"}, {"GLIBC_TUNABLES": "glibc.malloc.trim_threshold=131072"}],
    ids=["turned off", "set by the user"],
)
def test_thresholds_are_left_alone_when_turned_off_or_set_in_the_environment(env):
    applied, _ = _run(**env)
    assert not applied
