"""Soak: does a long stream of runs hold memory flat? Through the async API and InferenceSession.

    python benchmarks/soak.py [--model squeezenet] [--runs 10000] [--backends CpuAcc,CpuRef]

Runs one model ``--runs`` times through ``await model.run`` (two runs in flight, on a model
loaded with two pools), then as many times through ``InferenceSession.run`` from two Python
threads, and prints the process's RSS after run ``--baseline`` (500: once every kernel is
compiled and every pool used) and after the last run, with their ratio; the target is at most
``TARGET`` (RSS after the last run within 2% of RSS after the baseline run).
"""

from __future__ import annotations

import argparse
import resource
import threading
import time

import trio

import flowrt
from flowrt.models import light_model, pattern_input

TARGET = 1.02


def _rss_mib() -> float:
    """The process's resident memory now, in MiB (Linux)."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize() / 2**20


def _model_path(name: str) -> str:
    return name if name.endswith(".onnx") else str(light_model(name))


async def _feeds(opt: flowrt.OptimizedNetwork) -> dict:
    """The documented pattern input for each of the model's inputs."""
    async with flowrt.Runtime() as rt:
        model = await rt.load(opt)
        return {name: pattern_input(info) for name, info in model.inputs.items()}


async def _soak_async(
    opt: flowrt.OptimizedNetwork, feeds: dict, runs: int, baseline: int
) -> tuple[float, float]:
    rss: dict[int, float] = {}
    async with flowrt.Runtime() as rt:
        model = await rt.load(opt, max_in_flight=2)
        done = 0

        async def worker(count: int) -> None:
            nonlocal done
            for _ in range(count):
                await model.run(feeds)
                done += 1
                if done in (baseline, runs):
                    rss[done] = _rss_mib()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(worker, runs // 2)
            nursery.start_soon(worker, runs - runs // 2)
    return rss[baseline], rss[runs]


def _soak_session(opt: flowrt.OptimizedNetwork, feeds: dict, runs: int, baseline: int) -> tuple[float, float]:
    rss: dict[int, float] = {}
    lock = threading.Lock()
    done = 0
    with flowrt.InferenceSession(opt) as session:

        def worker(count: int) -> None:
            nonlocal done
            for _ in range(count):
                session.run(None, feeds)
                with lock:
                    done += 1
                    if done in (baseline, runs):
                        rss[done] = _rss_mib()

        threads = [threading.Thread(target=worker, args=(n,)) for n in (runs // 2, runs - runs // 2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    return rss[baseline], rss[runs]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default="squeezenet", help="a light model's name or an .onnx path")
    parser.add_argument("--runs", type=int, default=10_000)
    parser.add_argument("--baseline", type=int, default=500)
    parser.add_argument("--backends", default="CpuAcc,CpuRef")
    args = parser.parse_args()
    if not 0 < args.baseline < args.runs:
        parser.error(f"--baseline must be between 0 and --runs ({args.runs}), got {args.baseline}")
    opt = flowrt.optimize(flowrt.onnx.load(_model_path(args.model)), backends=args.backends.split(","))
    print(f"{args.model} on {args.backends}, {args.runs} runs per API, two at a time")
    print(f"| API | RSS after run {args.baseline} MiB | RSS after run {args.runs} MiB | ratio | seconds |")
    print("| --- | ---: | ---: | ---: | ---: |")
    feeds = trio.run(_feeds, opt)
    worst = 0.0
    for name, soak in (("async", lambda: trio.run(_soak_async, opt, feeds, args.runs, args.baseline)),
                       ("InferenceSession", lambda: _soak_session(opt, feeds, args.runs, args.baseline))):  # fmt: skip
        began = time.perf_counter()
        before, after = soak()
        ratio = after / before
        worst = max(worst, ratio)
        print(f"| {name} | {before:.1f} | {after:.1f} | {ratio:.3f} | {time.perf_counter() - began:.0f} |")
    print(f"worst ratio {worst:.3f} (target <= {TARGET})")


if __name__ == "__main__":
    main()
