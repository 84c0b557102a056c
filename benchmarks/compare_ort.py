"""Latency of the light models on flowrt backends vs ONNX Runtime, measured in the same run.

    python benchmarks/light_models.py [--backends CpuRef] [--iterations 10] [model ...]

Prints, per model, the median latency of flowrt and of ONNX Runtime (CPU provider, default
threads) and the ratio flowrt / ONNX Runtime (lower is better for flowrt).
"""

from __future__ import annotations

import argparse
import statistics
import time
from functools import partial

import numpy as np
import onnxruntime as ort
import trio

import flowrt
from flowrt.models import LIGHT_MODELS, light_model, pattern_input


def _median_ms(fn, iterations: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(iterations):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


async def _flowrt_ms(path: str, backends: list[str], iterations: int) -> tuple[float, dict]:
    opt = flowrt.optimize(flowrt.onnx.load(path), backends=backends)
    async with flowrt.Runtime() as rt:
        model = await rt.load(opt)
        feeds = {n: pattern_input(info) for n, info in model.inputs.items()}
        await model.run(feeds)
        times = []
        for _ in range(iterations):
            start = time.perf_counter()
            await model.run(feeds)
            times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3, feeds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="*", default=list(LIGHT_MODELS))
    parser.add_argument("--backends", default="CpuRef")
    parser.add_argument("--iterations", type=int, default=10)
    args = parser.parse_args()
    backends = args.backends.split(",")
    ort.set_default_logger_severity(3)
    print(f"{'model':<14} {'flowrt ms':>10} {'onnxruntime ms':>15} {'ratio':>7}")
    for name in args.models:
        path = str(light_model(name))
        ours, feeds = trio.run(_flowrt_ms, path, backends, args.iterations)
        session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
        theirs = _median_ms(partial(session.run, None, feeds), args.iterations)
        print(f"{name:<14} {ours:>10.2f} {theirs:>15.2f} {ours / theirs:>7.2f}")


if __name__ == "__main__":
    np.seterr(all="ignore")
    main()
