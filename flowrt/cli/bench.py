"""``flowrt bench``: latency percentiles, throughput and load time, optionally against ONNX Runtime
(ONNX Runtime's perf_test, OpenVINO's benchmark_app). The measuring is ``flowrt.bench``'s."""

from __future__ import annotations

import argparse
import json
import time

import attrs

from flowrt import bench as benchmark
from flowrt import serialize
from flowrt.cli import checks
from flowrt.cli.model import open_model, optimizer_flags
from flowrt.errors import InputError
from flowrt.models import default_model


def _check(args: argparse.Namespace) -> None:
    """Every option checked before the model is opened, ONNX Runtime's presence included."""
    checks.seconds("--duration", args.duration)
    if args.iterations < 1 or args.concurrency < 1:
        raise InputError(
            f"--iterations and --concurrency must be at least 1, got {args.iterations} and {args.concurrency}"
        )
    checks.at_least_one("--batch", args.batch)
    checks.threads(args.threads)
    if args.vs not in (None, "onnxruntime"):
        raise InputError(f"--vs takes 'onnxruntime', got {args.vs!r}")
    checks.model_file(args.model)
    if args.vs:
        checks.importable("--vs onnxruntime", "onnxruntime", "pip install onnxruntime")
        if serialize.is_flowrt_file(args.model):
            raise InputError(
                f"--vs onnxruntime needs an .onnx model, which ONNX Runtime reads; {args.model} is a "
                ".flowrt file: bench the .onnx it was converted from"
            )
    if args.plot:
        checks.importable("--plot", "matplotlib", "pip install 'flowrt[plot]'")
        checks.output_file("--plot", args.plot)


def _print(args: argparse.Namespace, backends: list[str], results: list[benchmark.BenchResult]) -> None:
    from flowrt.workers.cpu.workers import default_cpu_workers

    threads = args.threads or default_cpu_workers()
    if args.json:
        report = {
            "model": args.model,
            "backends": backends,
            "threads": threads,
            "concurrency": args.concurrency,
            "batch": args.batch,
            "hint": args.hint,
            "results": {r.engine: r.summary() for r in results},
            "notes": {r.engine: r.note for r in results if r.note},
        }
        print(json.dumps(report))
        return
    print(
        f"model: {args.model}  backends: {','.join(backends)}  threads: {threads}  "
        f"concurrency: {args.concurrency}  batch: {args.batch}"
        + (f"  hint: {args.hint}" if args.hint else "")
    )
    print(benchmark.format_results(results))
    if args.plot:
        print(f"latency plot: {args.plot}")


def command(args: argparse.Namespace) -> int:
    """``flowrt bench``: see the module docstring."""
    args.model = args.model or str(default_model())
    _check(args)
    start = time.perf_counter()
    opt = open_model(args.model, args.backends, flags=optimizer_flags(args))
    open_s = time.perf_counter() - start
    results = benchmark.run_bench(
        args.model,
        opt.backends,
        iterations=args.iterations,
        concurrency=args.concurrency,
        vs_onnxruntime=args.vs == "onnxruntime",
        progress=args.bars,
        duration=args.duration,
        batch=args.batch,
        optimized=opt,
        cpu_workers=args.threads,
        hint=args.hint,
    )
    # flowrt's load time is the whole of it: optimizing (or reading the .flowrt file), then loading.
    results[0] = attrs.evolve(results[0], load_s=results[0].load_s + open_s)
    if args.plot:
        with checks.writing("--plot", args.plot):
            benchmark.plot_latencies(results, args.plot)
    _print(args, opt.backends, results)
    return 0
