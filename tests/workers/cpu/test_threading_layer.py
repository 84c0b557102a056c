"""CpuAcc's parallel regions run on TBB, which the ``tbb`` dependency installs: a region does
not wait for a helper thread that the OS has not scheduled (see threading_layer.py)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from flowrt.cli import main
from flowrt.workers.cpu import threading_layer

# A network big enough that CpuAcc splits its Relu across the workers (a parallel region).
_SCRIPT = """
import numpy as np, flowrt
from flowrt.workers.cpu import threading_layer
net = flowrt.Network()
x = net.add_input("x", flowrt.TensorInfo((1, 64, 128, 128), flowrt.DataType.FLOAT32))
net.add_output("y", net.add_layer("Relu", inputs=[x]))
with flowrt.InferenceSession(net, backends=["CpuAcc"], cpu_workers=2) as session:
    (y,) = session.run(None, {"x": -np.ones((1, 64, 128, 128), np.float32)})
assert float(y.max()) == 0.0
print(threading_layer.current())
"""


def _layer_used(env: dict[str, str]) -> str:
    done = subprocess.run(
        [sys.executable, "-c", _SCRIPT],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip().splitlines()[-1]


needs_tbb = pytest.mark.skipif(threading_layer._load_tbb() is None, reason="the tbb package is not installed")


@needs_tbb
def test_cpuacc_runs_its_parallel_regions_on_tbb_when_it_is_installed():
    assert _layer_used({"NUMBA_THREADING_LAYER": ""}) == "tbb"


@needs_tbb
def test_a_threading_layer_the_user_chose_is_kept():
    assert _layer_used({"NUMBA_THREADING_LAYER": "workqueue"}) == "workqueue"


def test_flowrt_backends_names_the_threading_layer(capsys):
    assert main(["backends"]) == 0
    assert f"numba's {threading_layer.requested()!r} threading layer" in capsys.readouterr().out
    assert threading_layer.requested() in ("tbb", "omp", "workqueue", "default", "threadsafe", "safe")
