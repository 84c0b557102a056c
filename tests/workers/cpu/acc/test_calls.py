"""How CpuAcc's kernels call their slice functions (``calls.py``): the process's first
launches, from several threads at once."""

import subprocess
import sys

# Two threads run the same slice function for the first time in the process, the second
# while the first is still publishing the launchers' symbol (slowed down here): the second
# must wait for it, not run a launcher linked to a symbol that is not there yet.
_FIRST_LAUNCHES = """
import threading, time
import numpy as np
from flowrt.workers.cpu.acc import calls
from flowrt.workers.cpu.acc.kernels import cast

register = calls._register_parallel_tasks
registering = threading.Event()
def slow_register():
    registering.set()
    time.sleep(0.3)
    register()
calls._register_parallel_tasks = slow_register

results = {}
def run(name):
    x = np.arange(1000, dtype=np.float32)
    out = np.zeros(1000, np.float64)
    cast._cast(x, out, np.array([0, 500, 1000], np.int64))
    results[name] = bool((out == np.arange(1000)).all())
first = threading.Thread(target=run, args=("first",))
first.start()
registering.wait()
second = threading.Thread(target=run, args=("second",))
second.start()
first.join()
second.join()
print(results["first"], results["second"])
"""


def test_a_thread_that_comes_while_the_first_launch_registers_waits_for_it():
    done = subprocess.run(
        [sys.executable, "-c", _FIRST_LAUNCHES], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["True", "True"]
