"""How much flowrt and ONNX Runtime each slow down beside a busy process on the same machine.

    python benchmarks/contention.py [--models squeezenet,resnet50] [--iterations 20] [--busy spin|ort] [--workers 2]
        [--rounds 2]

For each model (a light model's name or a path to an .onnx file), each engine is timed alone
(a block of warm-up runs, then the timed runs; median latency) and then beside a busy
process: a separate process that keeps one core busy, started and seen running before the
engine's warm-up, stopped after its timed runs. ``--busy spin`` busies the core with a tight
single-threaded numpy loop; ``--busy ort`` with another ONNX Runtime session (one intra-op
thread) running the same model in a loop, which is what users hit when flowrt shares a
machine with another engine. flowrt runs with CpuAcc,CpuRef and ``--workers`` CPU workers,
ONNX Runtime (CPUExecutionProvider) with as many intra-op threads, not spinning between runs.
The engines are measured one at a time, with a pause between: never both in a timed block.

Each engine's four medians (alone and busy, per model) are the lowest of ``--rounds`` rounds,
the engines taking turns to go first: on a shared host a burst of someone else's work in one
block moved a ratio by 0.3 (ONNX Runtime alone 3.28 ms in one run, 2.11-2.17 in the others).
Prints a markdown table of each engine's slowdown (busy / alone) and the ratio of the
slowdowns (flowrt / ONNX Runtime; 1 means flowrt suffers as much as ONNX Runtime does, the
target is at most ``TARGET``), then the geometric mean of that ratio over the models.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import multiprocessing
import statistics
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path

import numpy as np
import onnxruntime as ort
import trio

import flowrt
from flowrt.bench import ort_session
from flowrt.models import light_model, pattern_input
from flowrt.workers.cpu.workers import default_cpu_workers

BACKENDS = ["CpuAcc", "CpuRef"]
DEFAULT_MODELS = "squeezenet,resnet50"
PAUSE = 0.5  # seconds between one engine's block and the next
BUSY_START_TIMEOUT = 120.0  # seconds for the busy process to import, load and run once
TARGET = 1.25


def _spin(ready, stop) -> None:
    """Keep one core busy with single-threaded numpy ufuncs (no BLAS, so no threads of its own)."""
    x = np.random.default_rng(0).random(1 << 14)
    out = np.empty_like(x)
    ready.set()
    while not stop.is_set():
        np.sqrt(x, out=out)
        np.multiply(out, 1.0001, out=out)


def _ort_loop(ready, stop, path: str, feeds: dict[str, np.ndarray]) -> None:
    """Keep one core busy with another ONNX Runtime session (one intra-op thread) running ``path``."""
    ort.set_default_logger_severity(3)
    session = ort_session(path, 1)
    session.run(None, feeds)
    ready.set()
    while not stop.is_set():
        session.run(None, feeds)


@contextlib.contextmanager
def busy_process(kind: str, path: str, feeds: dict[str, np.ndarray]) -> Iterator[None]:
    """A separate process keeping one core busy for the duration of the block.

    The block starts once the process is running its loop; the process is stopped when the
    block ends, and an error is raised if it died during the block (the timings would then
    not have been taken beside it).
    """
    # spawn, not fork: the parent holds ONNX Runtime's, numba's and trio's threads.
    context = multiprocessing.get_context("spawn")
    ready, stop = context.Event(), context.Event()
    args = (ready, stop) if kind == "spin" else (ready, stop, path, feeds)
    process = context.Process(target=_spin if kind == "spin" else _ort_loop, args=args, daemon=True)
    process.start()
    try:
        deadline = time.monotonic() + BUSY_START_TIMEOUT
        while not ready.wait(0.1):
            if not process.is_alive():
                raise RuntimeError(f"busy process ({kind}) exited with {process.exitcode} before it ran")
            if time.monotonic() > deadline:
                raise RuntimeError(f"busy process ({kind}) not running after {BUSY_START_TIMEOUT:.0f} s")
        yield
        if not process.is_alive():
            raise RuntimeError(f"busy process ({kind}) exited with {process.exitcode} during the timed runs")
    finally:
        stop.set()
        process.join(5)
        if process.is_alive():
            process.terminate()
            process.join()


async def _median_run(run: Callable[[], Awaitable[object]], iterations: int) -> float:
    """Median seconds of ``iterations`` calls of ``run``, after a block of warm-up calls."""
    for _ in range(max(5, iterations // 5)):
        await run()
    times = []
    for _ in range(iterations):
        start = time.perf_counter()
        await run()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def time_flowrt(path: str, iterations: int, workers: int, busy: str) -> tuple[float, float, dict]:
    """flowrt's median seconds per run alone and beside the busy process, and the feeds it used."""

    async def measure() -> tuple[float, float, dict]:
        opt = flowrt.optimize(flowrt.onnx.load(path), backends=BACKENDS)
        async with flowrt.Runtime(cpu_workers=workers) as rt:
            model = await rt.load(opt)
            feeds = {n: pattern_input(info) for n, info in model.inputs.items()}
            alone = await _median_run(lambda: model.run(feeds), iterations)
            time.sleep(PAUSE)
            with busy_process(busy, path, feeds):
                beside = await _median_run(lambda: model.run(feeds), iterations)
        return alone, beside, feeds

    return trio.run(measure)


def time_ort(path: str, feeds: dict, iterations: int, workers: int, busy: str) -> tuple[float, float]:
    """ONNX Runtime's median seconds per run alone and beside the busy process."""
    session = ort_session(path, workers)

    async def run() -> None:
        session.run(None, feeds)

    alone = trio.run(_median_run, run, iterations)
    time.sleep(PAUSE)
    with busy_process(busy, path, feeds):
        beside = trio.run(_median_run, run, iterations)
    return alone, beside


def model_paths(spec: str, parser: argparse.ArgumentParser) -> dict[str, str]:
    """Label and path of each model in ``spec``: light model names or paths to .onnx files."""
    paths = {}
    for item in filter(None, (s.strip() for s in spec.split(","))):
        path = Path(item) if item.endswith(".onnx") else light_model(item)
        if not path.is_file():
            parser.error(f"--models: {item!r} is neither a light model nor an .onnx file ({path} not found)")
        paths[path.stem.removeprefix("light_")] = str(path)
    return paths


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--models", default=DEFAULT_MODELS, help="light model names or .onnx paths, comma-separated"
    )
    parser.add_argument("--iterations", type=int, default=20)
    parser.add_argument("--busy", choices=("spin", "ort"), default="spin")
    parser.add_argument("--workers", type=int, default=default_cpu_workers())
    parser.add_argument("--rounds", type=int, default=2, help="rounds per engine; the lowest median is kept")
    args = parser.parse_args()
    if args.rounds < 1:
        parser.error(f"--rounds must be at least 1, got {args.rounds}")
    models = model_paths(args.models, parser)
    ort.set_default_logger_severity(3)
    busy = "a numpy loop" if args.busy == "spin" else "an ONNX Runtime session (1 thread) running the model"
    print(
        f"backends {','.join(BACKENDS)}, {args.workers} CPU workers / ORT intra-op threads, "
        f"{args.iterations} timed runs, the lowest median of {args.rounds} rounds; busy process: {busy} on one core"
    )
    print(
        "| model | flowrt alone ms | flowrt busy ms | flowrt slowdown "
        "| ORT alone ms | ORT busy ms | ORT slowdown | slowdown ratio |"
    )
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    ratios = []
    for name, path in models.items():
        ours_alone = ours_busy = theirs_alone = theirs_busy = math.inf
        feeds: dict = {}
        for round_ in range(args.rounds):
            for engine in ("flowrt", "ort") if round_ % 2 == 0 else ("ort", "flowrt"):
                if engine == "flowrt":
                    alone, beside, feeds = time_flowrt(path, args.iterations, args.workers, args.busy)
                    ours_alone, ours_busy = min(ours_alone, alone), min(ours_busy, beside)
                else:  # on flowrt's feeds: its round goes first in the first round
                    alone, beside = time_ort(path, feeds, args.iterations, args.workers, args.busy)
                    theirs_alone, theirs_busy = min(theirs_alone, alone), min(theirs_busy, beside)
                time.sleep(PAUSE)
        ours, theirs = ours_busy / ours_alone, theirs_busy / theirs_alone
        ratios.append(ours / theirs)
        print(
            f"| {name} | {ours_alone * 1e3:.2f} | {ours_busy * 1e3:.2f} | {ours:.2f} "
            f"| {theirs_alone * 1e3:.2f} | {theirs_busy * 1e3:.2f} | {theirs:.2f} | {ours / theirs:.2f} |"
        )
    geomean = math.exp(sum(math.log(r) for r in ratios) / len(ratios))
    print(f"geometric mean of flowrt slowdown / ORT slowdown: {geomean:.2f} (target <= {TARGET})")


if __name__ == "__main__":
    np.seterr(all="ignore")
    main()
