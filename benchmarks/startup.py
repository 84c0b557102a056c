"""Time to a model's first output in a fresh process: flowrt cold and warm, ONNX Runtime.

    python benchmarks/startup.py [--model resnet50] [--backends CpuAcc,CpuRef] [--repeat 3]

Each measurement is a new Python process that imports the engine, loads the model (flowrt:
``flowrt.onnx.load``, ``optimize``, ``Runtime``, ``rt.load``; ONNX Runtime: an
``InferenceSession``) and runs it once. Two times: from the process's start to that first
output (the process prints the monotonic clock, which all processes share, when it has the
output), and to the process's exit (the first, plus freeing its memory at exit); and its CPU
time (user + system, all threads) as the OS counts it.

- ``flowrt cold``: numba's kernel cache and flowrt's cache of optimized networks empty
  (``NUMBA_CACHE_DIR`` and ``FLOWRT_CACHE_DIR`` a new directory), so every kernel the model
  needs is compiled: what a first install pays once, with the progress bar.
- ``flowrt warm``: the same caches again, now full: what every later process pays.
- ``onnxruntime``: the peer, which compiles nothing (its process imports numpy and
  onnxruntime only).

Every process may write Python bytecode (``PYTHONDONTWRITEBYTECODE`` is left out of their
environment), as an installed package has it: the cold run writes what flowrt's lacks.

Prints a table and the ratio warm / ONNX Runtime (the median of ``--repeat`` processes each).
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time

from flowrt.models import light_model

FLOWRT = """
import sys, time, trio, flowrt
from flowrt.models import pattern_input
async def main():
    opt = flowrt.optimize(flowrt.onnx.load(sys.argv[1]), backends=sys.argv[2].split(","))
    async with flowrt.Runtime() as rt:
        model = await rt.load(opt)
        await model.run({n: pattern_input(i) for n, i in model.inputs.items()})
        print(time.monotonic())
trio.run(main)
"""

ORT = """
import sys, time, numpy as np, onnxruntime as ort
session = ort.InferenceSession(sys.argv[1], providers=["CPUExecutionProvider"])
shapes = {i.name: [d if isinstance(d, int) else 1 for d in i.shape] for i in session.get_inputs()}
session.run(None, {name: np.full(shape, 0.5, np.float32) for name, shape in shapes.items()})
print(time.monotonic())
"""


def _process(code: str, args: list[str], env: dict[str, str]) -> tuple[float, float, float]:
    """(seconds to the first output, to the exit, CPU seconds) of one process running ``code``,
    which prints ``time.monotonic()`` as its last line when it has its output."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-c", code, *args], env=env, check=True, stdout=subprocess.PIPE, text=True
    )
    wall = time.monotonic() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return float(done.stdout.split()[-1]) - start, wall, cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="resnet50")
    parser.add_argument("--backends", default="CpuAcc,CpuRef")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    path = str(light_model(args.model))
    rows = []
    with tempfile.TemporaryDirectory() as cache:
        # Python writes the bytecode of the modules it imports, as an installed package has
        # it (pip compiles it at install): where PYTHONDONTWRITEBYTECODE is set, every process
        # compiled each flowrt module edited since its last .pyc from source again.
        python = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
        env = dict(python, NUMBA_CACHE_DIR=cache, FLOWRT_CACHE_DIR=os.path.join(cache, "flowrt"))
        rows.append(("flowrt cold", *_process(FLOWRT, [path, args.backends], env)))
        warm = [_process(FLOWRT, [path, args.backends], env) for _ in range(args.repeat)]
    theirs = [_process(ORT, [path], python) for _ in range(args.repeat)]
    for name, runs in (("flowrt warm", warm), ("onnxruntime", theirs)):
        rows.append((name, *(statistics.median(run[i] for run in runs) for i in range(3))))
    print(f"{args.model}, backends {args.backends}; fresh processes (median of {args.repeat})\n")
    print("| engine | to first output s | to exit s | CPU s |")
    print("| --- | ---: | ---: | ---: |")
    for name, first, wall, cpu in rows:
        print(f"| {name} | {first:.2f} | {wall:.2f} | {cpu:.2f} |")
    print(f"\nwarm flowrt / ONNX Runtime, to first output: {rows[1][1] / rows[2][1]:.2f}")
    print(f"warm flowrt / ONNX Runtime, to exit: {rows[1][2] / rows[2][2]:.2f}")


if __name__ == "__main__":
    main()
