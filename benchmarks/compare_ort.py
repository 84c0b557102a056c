"""Latency of the light models on flowrt vs ONNX Runtime, measured alternately in one process.

    python benchmarks/compare_ort.py [--backends CpuAcc,CpuRef] [--iterations 10] [model ...]

For each model: flowrt's load time (optimize + load) and first run, then rounds that run
flowrt and ONNX Runtime (CPUExecutionProvider, ``intra_op_num_threads`` equal to flowrt's CPU
workers) alternately, one run each, after a warm-up of both. Prints the median latency of each,
the ratio flowrt / ONNX Runtime (lower is better for flowrt), and the geometric mean of the
ratios over the models.

ONNX Runtime's intra-op threads are told not to spin between runs
(``session.intra_op.allow_spinning`` = 0): spinning, they would hold the cores through
flowrt's turn. Alone, ONNX Runtime is within about 5% of its spinning speed that way.
Each turn also starts after a pause of ``TURN_PAUSE``, long enough for the other engine's
idle threads to stop spinning (flowrt's OpenMP threads spin briefly after a kernel, as
libgomp's do), so that each engine runs on cores the other has left.
"""

from __future__ import annotations

import argparse
import math
import statistics
import time

import numpy as np
import onnxruntime as ort
import trio

import flowrt
from flowrt.bench import ort_session
from flowrt.models import LIGHT_MODELS, light_model, pattern_input
from flowrt.workers.cpu.workers import default_cpu_workers

TURN_PAUSE = 0.002  # seconds


async def _compare(path: str, backends: list[str], iterations: int, workers: int) -> dict[str, float]:
    start = time.perf_counter()
    opt = flowrt.optimize(flowrt.onnx.load(path), backends=backends)
    async with flowrt.Runtime(cpu_workers=workers) as rt:
        model = await rt.load(opt)
        load_ms = (time.perf_counter() - start) * 1e3
        feeds = {n: pattern_input(info) for n, info in model.inputs.items()}
        start = time.perf_counter()
        await model.run(feeds)
        first_ms = (time.perf_counter() - start) * 1e3
        session = ort_session(path, workers)
        session.run(None, feeds)
        await model.run(feeds)
        ours, theirs = [], []
        for _ in range(iterations):
            time.sleep(TURN_PAUSE)
            start = time.perf_counter()
            await model.run(feeds)
            ours.append(time.perf_counter() - start)
            time.sleep(TURN_PAUSE)
            start = time.perf_counter()
            session.run(None, feeds)
            theirs.append(time.perf_counter() - start)
    return {
        "flowrt_ms": statistics.median(ours) * 1e3,
        "ort_ms": statistics.median(theirs) * 1e3,
        "load_ms": load_ms,
        "first_ms": first_ms,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="*", default=list(LIGHT_MODELS))
    parser.add_argument("--backends", default="CpuAcc,CpuRef")
    parser.add_argument("--iterations", type=int, default=10)
    parser.add_argument("--workers", type=int, default=default_cpu_workers())
    args = parser.parse_args()
    backends = args.backends.split(",")
    ort.set_default_logger_severity(3)
    print(f"backends {','.join(backends)}, {args.workers} CPU workers / ORT intra-op threads")
    print(f"{'model':<14} {'flowrt ms':>10} {'ORT ms':>8} {'ratio':>6} {'load ms':>8} {'first run ms':>13}")
    ratios = []
    for name in args.models:
        r = trio.run(_compare, str(light_model(name)), backends, args.iterations, args.workers)
        ratio = r["flowrt_ms"] / r["ort_ms"]
        ratios.append(ratio)
        print(
            f"{name:<14} {r['flowrt_ms']:>10.2f} {r['ort_ms']:>8.2f} {ratio:>6.2f} "
            f"{r['load_ms']:>8.0f} {r['first_ms']:>13.1f}"
        )
    geomean = math.exp(sum(math.log(r) for r in ratios) / len(ratios))
    print(f"geometric mean of flowrt/ORT: {geomean:.2f}; largest: {max(ratios):.2f}")


if __name__ == "__main__":
    np.seterr(all="ignore")
    main()
