"""How CpuAcc's kernels call their slice functions (``calls.py``): the process's first
launches, from several threads at once; calls by address in a loop, which count no
references; an error raised in one."""

import os
import subprocess
import sys

import numpy as np
import pytest
from numba import njit, types

from flowrt.workers.cpu.acc.calls import NATIVE, call_native, native_address

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


# A loop of calls by address, each given views of two arrays, run under numba's reference
# count tracing (NUMBA_DEBUG_NRT prints each incref and decref; its own cache, as the traced
# code differs). The callee has a loop, where LLVM keeps numba's increfs of the arguments.
_CALLS_IN_A_LOOP = """
import ctypes
import numpy as np
from numba import njit, types
from flowrt.workers.cpu.acc.calls import NATIVE, call_native, native_address

@njit(**NATIVE)
def copy_one(a, at, b):
    for i in range(at, at + 1):
        b[i] = a[i]

row = types.Array(types.float32, 1, "C")
address = native_address(copy_one, (row, types.int64, row))

@njit(nogil=True)
def copy(a, b, n, address):
    for i in range(n):
        call_native(address, (a[i:], 0, b[i:]))

a, b = np.arange(100, dtype=np.float32), np.zeros(100, np.float32)
copy(a, b, 100, address)
libc = ctypes.CDLL(None)
libc.printf(b"GO\\n")
copy(a, b, 100, address)
libc.printf(b"END\\n")
libc.fflush(None)
print(bool((a == b).all()))
"""


def test_calls_by_address_in_a_loop_count_no_references(tmp_path):
    script = tmp_path / "calls_in_a_loop.py"  # a file: numba caches only functions from one
    script.write_text(_CALLS_IN_A_LOOP)
    env = {**os.environ, "NUMBA_DEBUG_NRT": "1", "NUMBA_CACHE_DIR": str(tmp_path / "numba")}
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    lines = done.stdout.splitlines()
    assert lines[-1] == "True"
    during = lines[lines.index("GO") + 1 : lines.index("END")]
    # (the two decrefs as the call from Python returns release its two arguments' meminfos)
    assert sum("NRT_Incref" in line for line in during) == 0


@njit(**NATIVE)
def _refuse_negative(a, at):
    if a[at] < 0:
        raise ValueError("a negative value")


_ROW = types.Array(types.float32, 1, "C")


@njit(nogil=True)
def _check_each(a, address):
    for i in range(a.shape[0]):
        call_native(address, (a[i:], 0))


def test_an_error_in_a_function_called_by_address_reaches_the_caller():
    address = native_address(_refuse_negative, (_ROW, types.int64))
    _check_each(np.array([1, 2, 3], np.float32), address)  # no error: returns
    with pytest.raises(ValueError, match="a negative value"):
        _check_each(np.array([1, -2, 3], np.float32), address)
