"""Memory planned for the light models: arena vs lower bound vs no reuse, per model.

    python benchmarks/memory.py [--backends CpuRef] [--churn 2000] [--rss [--models a,b]]

Targets: arena <= 1.10 x lower bound on every model; arena <= 0.5 x no-reuse on resnet50,
densenet121 and inception_v2. With --churn N, instead runs squeezenet N times, a random third
of the runs cancelled after a random delay, and prints the pools left free and the RSS growth
between run 100 and run N.

With --shared, instead what loads of one model (``--models``, default resnet50) on CpuAcc add
beyond their arenas in one process: a second load of the same optimized network, a load at
batch 4, and a batching stream up to 8 (batch sizes 1, 2, 4, 8), with the transformed weights
each load made and found shared (``memory_report``), numba's kernel cache warmed by one
discarded process first (a first process on a machine also compiles the kernels, whose LLVM
memory the loads would count). Target (same issue): each load adds at most 10% of the
model's weight bytes beyond its arenas; the stream holds each transformed weight once.

With --rss, instead the peak RSS of a fresh process per engine and model that loads the model
and runs it three times: flowrt (``--backends``, default then CpuAcc,CpuRef, numba's kernel
cache warmed by one discarded process first) against ONNX Runtime (CPU provider), and of a
process that only imports each engine (flowrt also with CpuAcc's kernels imported), and of
flowrt's process again with ``reduce_fp32_to_fp16`` (CpuAcc's weights kept as float16). The
target (issue: memory a user pays) is flowrt <= ONNX Runtime.
"""

from __future__ import annotations

import argparse
import os
import random
import resource
import subprocess
import sys

import numpy as np
import trio

import flowrt
from flowrt.models import LIGHT_MODELS, light_model, pattern_input

REUSE_TARGETS = ("resnet50", "densenet121", "inception_v2")
_WARMING = "FLOWRT_MEMORY_SHARED_WARMING"  # set in --shared's discarded first process


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


# Each prints its own peak RSS in MiB as its last line; argv: model path, backends (flowrt),
# "fp16" or "fp32" (flowrt: OptimizerOptions.reduce_fp32_to_fp16).
_RSS_CHILD = {
    "flowrt": """
import resource, sys, trio, flowrt
from flowrt.models import pattern_input
async def main():
    options = flowrt.OptimizerOptions(reduce_fp32_to_fp16=sys.argv[3] == "fp16")
    opt = flowrt.optimize(flowrt.onnx.load(sys.argv[1]), backends=sys.argv[2].split(","), options=options)
    async with flowrt.Runtime() as rt:
        model = await rt.load(opt)
        for _ in range(3):
            await model.run({n: pattern_input(i) for n, i in model.inputs.items()})
trio.run(main)
print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
""",
    "onnxruntime": """
import resource, sys, numpy as np, onnxruntime as ort
session = ort.InferenceSession(sys.argv[1], providers=["CPUExecutionProvider"])
shapes = {i.name: [d if isinstance(d, int) else 1 for d in i.shape] for i in session.get_inputs()}
for _ in range(3):
    session.run(None, {name: np.full(shape, 0.5, np.float32) for name, shape in shapes.items()})
print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
""",
}
_IMPORTS = {
    "import flowrt": "import flowrt",
    "import flowrt + CpuAcc kernels": "import flowrt.workers.cpu.acc.kernels as k; k.load_all()",
    "import onnxruntime": "import numpy, onnxruntime",
}


def _peak_mib(code: str, *argv: str) -> float:
    done = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True, check=True)
    return float(done.stdout.split()[-1])


def rss_report(models: list[str], backends: str) -> None:
    """Peak RSS per engine and model, each in a fresh process (see the module doc)."""
    print(f"peak RSS MiB of a fresh process; flowrt on {backends}, and with float16 weights (--fp16)")
    print("| process | flowrt | ONNX Runtime | flowrt / ORT | flowrt --fp16 | --fp16 / ORT |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    peak = "import resource; print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)"
    ort_import = _peak_mib(f"{_IMPORTS['import onnxruntime']}\n{peak}")
    for label in ("import flowrt", "import flowrt + CpuAcc kernels"):
        ours = _peak_mib(f"{_IMPORTS[label]}\n{peak}")
        print(
            f"| {label} (ORT: import onnxruntime) | {ours:.0f} | {ort_import:.0f} | {ours / ort_import:.2f} | | |"
        )
    for name in models:
        path = str(light_model(name))
        for precision in ("fp32", "fp16"):  # fills numba's cache, if it must
            _peak_mib(_RSS_CHILD["flowrt"], path, backends, precision)
        ours = _peak_mib(_RSS_CHILD["flowrt"], path, backends, "fp32")
        half = _peak_mib(_RSS_CHILD["flowrt"], path, backends, "fp16")
        theirs = _peak_mib(_RSS_CHILD["onnxruntime"], path)
        print(
            f"| {name}: load, 3 runs | {ours:.0f} | {theirs:.0f} | {ours / theirs:.2f} | {half:.0f} | "
            f"{half / theirs:.2f} |"
        )


def _weights_of(model: flowrt.LoadedNetwork) -> tuple[int, int, int]:
    """(arena bytes of one pool, transformed weights made, transformed weights shared)."""
    report = model.memory_report().values()
    return (
        sum(r.get("arena_bytes", 0) for r in report),
        sum(r["weights_bytes"] for r in report),
        sum(r["shared_weights_bytes"] for r in report),
    )


async def _shared(name: str, backends: list[str]) -> None:
    from flowrt.engine.memory.weights import MANAGER

    opt = flowrt.optimize(flowrt.onnx.load(light_model(name)), backends=backends)
    weight_bytes = sum(layer.descriptor.value.nbytes for layer in opt.graph if layer.kind == "Constant")
    mib = 2**20
    print(f"{name} on {','.join(backends)}: weights {weight_bytes / mib:.1f} MiB; one pool per load")
    print(
        "| load | RSS added MiB | arenas MiB | beyond arenas MiB | of weight bytes | transformed weights made / shared MiB |"
    )
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    inputs = {layer.name: layer.output_infos[0] for layer in opt.graph if layer.kind == "Input"}
    async with flowrt.Runtime() as rt:

        async def measured(label: str, batch: int = 1) -> flowrt.LoadedNetwork:
            # The caller's feeds are made first: their bytes are not what the load adds.
            feeds = {n: np.concatenate([pattern_input(i)] * batch) for n, i in inputs.items()}
            before = _rss_mib()
            model = await rt.load(opt, max_in_flight=1, batch=batch)
            for _ in range(3):
                await model.run(feeds)
            added = _rss_mib() - before
            del feeds
            arena, made, shared = _weights_of(model)
            beyond = added - arena / mib
            print(
                f"| {label} | {added:.1f} | {arena / mib:.1f} | {beyond:.1f} | "
                f"{beyond * mib / weight_bytes:.1%} | {made / mib:.1f} / {shared / mib:.1f} |"
            )
            return model

        first = await measured("first")
        await measured("second, same network")
        await measured("batch 4", batch=4)
        async with first.stream(max_batch=8) as stream:
            await stream.submit({n: pattern_input(i) for n, i in first.inputs.items()})
            variants = [await first.batched(size) for size in (2, 4, 8)]
        figures = [_weights_of(v) for v in [first, *variants]]
        each = sum(made + shared for _, made, shared in figures)
        print(
            f"\nbatching stream up to 8 (batch 1, 2, 4, 8): the variants read {each / mib:.1f} MiB of "
            f"transformed weights; the process holds {MANAGER.held_bytes() / mib:.1f} MiB of them "
            "(every load above included)"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backends", default=None, help="default: CpuRef; with --rss CpuAcc,CpuRef")
    parser.add_argument("--churn", type=int, default=0)
    parser.add_argument("--rss", action="store_true", help="peak RSS against ONNX Runtime")
    parser.add_argument("--shared", action="store_true", help="what further loads add (see the doc)")
    parser.add_argument("--models", default=None, help="--rss, --shared: comma-separated")
    args = parser.parse_args()
    if args.shared:
        backends = args.backends or "CpuAcc,CpuRef"
        for name in (args.models or "resnet50").split(","):
            if not os.environ.get(_WARMING):  # numba's kernel cache warmed by a discarded process
                warm = [sys.executable, __file__, "--shared", "--models", name, "--backends", backends]
                subprocess.run(warm, env={**os.environ, _WARMING: "1"}, capture_output=True, check=True)
            trio.run(_shared, name, backends.split(","))
        return
    if args.rss:
        rss_report((args.models or ",".join(LIGHT_MODELS)).split(","), args.backends or "CpuAcc,CpuRef")
        return
    backends = (args.backends or "CpuRef").split(",")
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
