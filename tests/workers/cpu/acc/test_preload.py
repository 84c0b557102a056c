"""A network's CpuAcc kernels loaded from numba's cache by its manifest, its layers not run
at load (preload.py)."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np

import flowrt
from flowrt.types import TensorInfo
from flowrt.workers.cpu.acc import preload
from flowrt.workers.cpu.acc.workload_factory import AccWorkload


def _net(size: int = 12) -> flowrt.Network:
    rng = np.random.default_rng(0)

    def w(*shape):
        return (rng.standard_normal(shape) / np.sqrt(np.prod(shape[1:]))).astype(np.float32)

    net = flowrt.Network()
    x = net.add_input("x", TensorInfo((1, 4, size, size)))
    a = net.add_layer("Conv", flowrt.descriptors.Conv(pads=(1, 1, 1, 1)), [x, w(8, 4, 3, 3), w(8)], name="a")
    b = net.add_layer("Relu", inputs=[a], name="b")
    c = net.add_layer("Add", inputs=[b, w(8, 1, 1)], name="c")
    net.add_output("y", net.add_layer("MatMul", inputs=[c, w(size, 6)], name="d"))
    return net


def _input() -> np.ndarray:
    return np.random.default_rng(1).standard_normal((1, 4, 12, 12)).astype(np.float32)


class _Counted:
    """Counts the CpuAcc layers run (AccWorkload.execute) while it is on."""

    def __init__(self, monkeypatch) -> None:
        self.count = 0
        execute = AccWorkload.execute

        def counted(workload, *args):
            self.count += 1
            return execute(workload, *args)

        monkeypatch.setattr(AccWorkload, "execute", counted)


async def _load_and_run(
    net, counted: _Counted, weights: list | None = None
) -> tuple[int, np.ndarray, np.ndarray]:
    """(layers run by the load, CpuAcc's output, CpuRef's); the weight bytes the load made
    or took appended to ``weights``."""
    async with flowrt.Runtime(cpu_workers=2) as rt:
        counted.count = 0
        model = await rt.load(flowrt.optimize(net, backends=["CpuAcc", "CpuRef"]))
        ran = counted.count
        if weights is not None:
            report = model.memory_report()["CpuAcc"]
            weights.append(report["weights_bytes"] + report["shared_weights_bytes"])
        got = (await model.run({"x": _input()}))["y"]
        reference = await rt.load(flowrt.optimize(net, backends=["CpuRef"]))
        want = (await reference.run({"x": _input()}))["y"]
    return ran, got, want


async def test_a_second_load_takes_its_kernels_from_the_manifest_and_runs_no_layer(tmp_path, monkeypatch):
    monkeypatch.setattr(preload, "_manifest_dir", lambda: tmp_path)
    monkeypatch.setattr(preload, "_fresh", lambda: True)  # as the first load of a fresh process
    counted = _Counted(monkeypatch)
    net = _net()
    weights: list[int] = []
    ran, got, want = await _load_and_run(net, counted, weights)
    assert ran > 0  # no manifest: the load warms its layers up by running them
    assert len(list(tmp_path.glob("*.pickle"))) == 1
    ran, got, want = await _load_and_run(net, counted, weights)
    assert ran == 0
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    # the forms of the conv's weights its first run would make are made at load all the same
    assert weights[1] == weights[0] > 0


async def test_a_manifest_whose_kernel_would_compile_leaves_the_load_to_run_its_layers(tmp_path, monkeypatch):
    monkeypatch.setattr(preload, "_manifest_dir", lambda: tmp_path)
    monkeypatch.setattr(preload, "_fresh", lambda: True)
    counted = _Counted(monkeypatch)
    net = _net()
    await _load_and_run(net, counted)
    monkeypatch.setattr(preload, "_load", lambda dispatcher, signature: False)  # as if it compiled
    ran, got, want = await _load_and_run(net, counted)
    assert ran > 0
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


async def test_a_manifest_written_beside_other_kernels_serves_no_fresh_process(tmp_path, monkeypatch):
    # what such a process holds includes the other networks' functions: written down as
    # this network's, a fresh process would load them all. It writes an unclean manifest,
    # which a process already holding functions replays and a fresh one does not.
    counted = _Counted(monkeypatch)
    monkeypatch.setattr(preload, "_manifest_dir", lambda: tmp_path / "other")
    await _load_and_run(_net(), counted)  # the process now holds the net's functions
    assert not preload._fresh()
    monkeypatch.setattr(preload, "_manifest_dir", lambda: tmp_path / "this")
    ran, got, want = await _load_and_run(_net(), counted)
    assert ran > 0  # no manifest yet: warmed up by running its layers
    (written,) = (tmp_path / "this").glob("*.pickle")
    key = written.stem
    assert preload.replay(key, fresh=False)
    assert not preload.replay(key, fresh=True)
    ran, got, want = await _load_and_run(_net(), counted)
    assert ran == 0  # this process holds functions: the unclean manifest serves it
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_the_key_follows_the_layers_shapes():
    one = flowrt.optimize(_net(), backends=["CpuAcc", "CpuRef"])
    same = flowrt.optimize(_net(), backends=["CpuAcc", "CpuRef"])
    other = flowrt.optimize(_net(16), backends=["CpuAcc", "CpuRef"])
    assert preload.network_key(one, 2) == preload.network_key(same, 2)
    assert preload.network_key(one, 2) != preload.network_key(other, 2)
    assert preload.network_key(one, 2) != preload.network_key(one, 1)


# A fresh process: loads the network and prints how many layers its load ran, and the output.
_SCRIPT = """
import sys
from pathlib import Path
import numpy as np
import trio
import flowrt
from flowrt.workers.cpu.acc import preload
from flowrt.workers.cpu.acc.workload_factory import AccWorkload
sys.path.insert(0, sys.argv[2])
from test_preload import _input, _net

preload._manifest_dir = lambda: Path(sys.argv[1])
ran = []
execute = AccWorkload.execute
AccWorkload.execute = lambda workload, *args: ran.append(1) or execute(workload, *args)

async def main():
    async with flowrt.Runtime(cpu_workers=2) as rt:
        model = await rt.load(flowrt.optimize(_net(), backends=["CpuAcc", "CpuRef"]))
        loaded = len(ran)
        y = (await model.run({"x": _input()}))["y"]
    print(loaded, float(np.abs(y).sum()))

trio.run(main)
"""


def test_a_fresh_process_loads_the_manifests_kernels_from_numbas_cache(tmp_path):
    def fresh() -> tuple[int, float]:
        done = subprocess.run(
            [sys.executable, "-c", _SCRIPT, str(tmp_path), os.path.dirname(__file__)],
            capture_output=True,
            text=True,
            check=True,
        )
        ran, total = done.stdout.split()[-2:]
        return int(ran), float(total)

    first, second = fresh(), fresh()
    assert first[0] > 0 and second[0] == 0
    assert second[1] == first[1] > 0


def test_a_function_compiled_inside_another_is_a_callee_and_the_caller_is_not(monkeypatch):
    import numba
    from numba.core import event

    @numba.njit
    def inner(x):
        return x + 1

    @numba.njit
    def outer(x):
        return inner(x) * 2

    mine = [(f.py_func.__module__, f.py_func.__qualname__, f) for f in (inner, outer)]
    monkeypatch.setattr(preload, "_cached_dispatchers", lambda: iter(mine))
    callees = preload._Callees()
    with event.install_listener("numba:compile", callees):
        assert outer(np.int64(3)) == 8
    held = preload._held()
    assert {n.split(".")[-1] for _, n, _ in held} == {"inner", "outer"}
    assert {n.split(".")[-1] for _, n, _ in callees.found} == {"inner"}
    assert callees.depth == 0
