"""On an empty kernel cache, a load of a network with many CpuAcc layers compiles its kernels
with a second process (``compile_ahead``): the results are unchanged, the helper leaves, and
no claim is left in the cache."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time

import numpy as np
import pytest

from flowrt.defaults import default_cpu_workers
from flowrt.workers.cpu.acc import cache_claims, compile_ahead

# A chain of Add / Relu / Mul layers (one CpuAcc layer each) loaded on CpuAcc, its output
# printed as its difference from CpuRef's; logging at INFO on stderr.
_LOAD = """
import logging, sys
import numpy as np, trio, flowrt
from onnx import TensorProto, helper, numpy_helper

logging.basicConfig(level=logging.INFO, stream=sys.stderr)
layers = int(sys.argv[1])
rng = np.random.default_rng(0)
nodes, inits, prev = [], [], "x"
for i in range(layers):
    out, kind = (f"t{i}" if i < layers - 1 else "y"), ("Add", "Relu", "Mul")[i % 3]
    inputs = [prev]
    if kind != "Relu":
        inits.append(numpy_helper.from_array(rng.uniform(0.9, 1.1, (1, 64)).astype(np.float32), f"c{i}"))
        inputs.append(f"c{i}")
    nodes.append(helper.make_node(kind, inputs, [out], name=f"n{i}"))
    prev = out
graph = helper.make_graph(nodes, "chain", [helper.make_tensor_value_info("x", TensorProto.FLOAT, (1, 64))],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, (1, 64))], inits)
network = flowrt.onnx.load(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
x = {"x": rng.standard_normal((1, 64)).astype(np.float32)}

async def main():
    async with flowrt.Runtime() as rt:
        ours = await rt.load(flowrt.optimize(network, backends=["CpuAcc"]))
        reference = await rt.load(flowrt.optimize(network, backends=["CpuRef"]))
        y, y_ref = (await ours.run(x))["y"], (await reference.run(x))["y"]
    print(float(np.max(np.abs(y - y_ref))))

trio.run(main)
"""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.mark.skipif(not cache_claims.AVAILABLE or default_cpu_workers() < 2, reason="no helper here")
def test_a_cold_load_compiles_ahead_in_a_helper_that_then_leaves(tmp_path):
    env = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path))
    env.pop(compile_ahead.ENV, None)
    done = subprocess.run(
        [sys.executable, "-c", _LOAD, str(2 * compile_ahead.MIN_LAYERS)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    assert float(done.stdout.split()[-1]) <= 1e-6
    started = re.search(r"CpuAcc compiles ahead in process (\d+)", done.stderr)
    assert started, done.stderr
    helper = int(started.group(1))
    deadline = time.monotonic() + 60
    while _alive(helper) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _alive(helper)
    assert not list(tmp_path.rglob("*.claim"))


def _network(cpu_acc_layers: int, constant_bytes: int = 1000):
    layer = type("Layer", (), {})
    layers = [layer() for _ in range(cpu_acc_layers + 3)]
    for i, one in enumerate(layers):
        one.backend, one.kind = ("CpuAcc", "Conv") if i < cpu_acc_layers else (None, "Constant")
        one.descriptor = type("Descriptor", (), {"value": np.zeros(constant_bytes // 3, np.uint8)})()
    return type("Network", (), {"graph": layers})()


def test_a_helper_is_wanted_for_enough_layers_unless_turned_off(monkeypatch):
    monkeypatch.setattr(compile_ahead, "default_cpu_workers", lambda: 2)
    monkeypatch.setattr(cache_claims, "AVAILABLE", True)
    monkeypatch.delenv(compile_ahead.ENV, raising=False)
    assert compile_ahead.wanted(_network(compile_ahead.MIN_LAYERS))
    assert not compile_ahead.wanted(_network(compile_ahead.MIN_LAYERS - 1))
    monkeypatch.setenv(compile_ahead.ENV, "0")
    assert not compile_ahead.wanted(_network(compile_ahead.MIN_LAYERS))
    monkeypatch.delenv(compile_ahead.ENV)
    monkeypatch.setattr(compile_ahead, "default_cpu_workers", lambda: 1)
    assert not compile_ahead.wanted(_network(compile_ahead.MIN_LAYERS))
    monkeypatch.setattr(compile_ahead, "default_cpu_workers", lambda: 2)
    monkeypatch.setattr(compile_ahead, "MAX_CONSTANT_BYTES", 3000)
    assert compile_ahead.wanted(_network(compile_ahead.MIN_LAYERS, constant_bytes=3000))
    assert not compile_ahead.wanted(_network(compile_ahead.MIN_LAYERS, constant_bytes=3003))
