"""Memory planned for the light models: arena vs lower bound vs no reuse, per model.

    python benchmarks/memory.py [--backends CpuRef] [--churn 2000]

Targets: arena <= 1.10 x lower bound on every model; arena <= 0.5 x no-reuse on resnet50,
densenet121 and inception_v2. With --churn N, instead runs squeezenet N times, a random third
of the runs cancelled after a random delay, and prints the pools left free and the RSS growth
between run 100 and run N.
"""

from __future__ import annotations

import argparse
import random
import resource

import trio

import flowrt
from flowrt.models import LIGHT_MODELS, light_model, pattern_input

REUSE_TARGETS = ("resnet50", "densenet121", "inception_v2")


async def _report(name: str, backends: list[str]) -> dict[str, int]:
    opt = flowrt.optimize(flowrt.onnx.load(light_model(name)), backends=backends)
    async with flowrt.Runtime() as rt:
        model = await rt.load(opt, max_in_flight=1)
        totals = {"arena_bytes": 0, "no_reuse_bytes": 0, "lower_bound_bytes": 0}
        for figures in model.memory_report().values():
            for key in totals:
                totals[key] += figures[key]
        return totals


def _rss_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize() / 2**20


async def _churn(runs: int, backends: list[str]) -> None:
    rng = random.Random(0)
    opt = flowrt.optimize(flowrt.onnx.load(light_model("squeezenet")), backends=backends)
    async with flowrt.Runtime() as rt:
        model = await rt.load(opt, max_in_flight=2)
        feeds = {n: pattern_input(info) for n, info in model.inputs.items()}
        rss_100 = None
        cancelled = 0
        for i in range(runs):
            if rng.random() < 1 / 3:
                with trio.move_on_after(rng.uniform(0, 0.03)) as scope:
                    await model.run(feeds)
                cancelled += scope.cancelled_caught
            else:
                await model.run(feeds)
            if i == 99:
                rss_100 = _rss_mib()
        rss_end = _rss_mib()
        print(f"churn: {runs} runs, {cancelled} cancelled mid-run, pools free {model.pools.free_count}/2")
        if rss_100 is not None:
            print(
                f"RSS after run 100: {rss_100:.1f} MiB, after run {runs}: {rss_end:.1f} MiB ({(rss_end / rss_100 - 1) * 100:+.1f}%)"
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backends", default="CpuRef")
    parser.add_argument("--churn", type=int, default=0)
    args = parser.parse_args()
    backends = args.backends.split(",")
    if args.churn:  # alone in the process, so the RSS figures are the churn's own
        trio.run(_churn, args.churn, backends)
        return
    mib = 2**20
    print(
        f"{'model':<14} {'arena MiB':>10} {'lower bound':>12} {'no reuse':>10} {'arena/lb':>9} {'arena/no-reuse':>15}"
    )
    for name in LIGHT_MODELS:
        r = trio.run(_report, name, backends)
        lb, nr, arena = r["lower_bound_bytes"], r["no_reuse_bytes"], r["arena_bytes"]
        flag = " *" if name in REUSE_TARGETS else ""
        print(
            f"{name:<14} {arena / mib:>10.2f} {lb / mib:>12.2f} {nr / mib:>10.2f} {arena / lb:>9.3f} {arena / nr:>15.3f}{flag}"
        )
    print("* reuse target: arena <= 0.5 x no reuse; every model: arena <= 1.10 x lower bound")


if __name__ == "__main__":
    main()
