"""The ``flowrt`` command line: run, inspect, convert, bench, tune, backends."""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import trio

import flowrt
from flowrt import serialize
from flowrt.errors import FlowrtError, InputError
from flowrt.models import default_model, expected_outputs, expected_tolerance, pattern_input
from flowrt.profiling import top_layers, write_chrome_trace
from flowrt.progress import load_progress
from flowrt.registry import BackendRegistry
from flowrt.registry.dynamic import format_report, load_dynamic_backends
from flowrt.types import TensorInfo
from flowrt.workers.cpu import threading_layer


def _backends(text: str) -> list[str]:
    return [b.strip() for b in text.split(",") if b.strip()]


def _registry() -> BackendRegistry:
    """The process's backends and the dynamic ones a Runtime would load (FLOWRT_BACKEND_PATHS and
    the ``flowrt.backends`` entry points), for commands that optimize before any runtime exists."""
    registry = flowrt.backend_registry().copy()
    load_dynamic_backends(registry)
    return registry


def _optimized(
    path: str, backends: str | None, options: flowrt.OptimizerOptions | None = None
) -> flowrt.OptimizedNetwork:
    """A .flowrt file as it was converted, or an ONNX model optimized for ``backends`` (default CpuRef)."""
    registry = _registry()
    if serialize.is_flowrt_file(path):
        opt = serialize.load(path, registry=registry)
        if backends is not None and _backends(backends) != opt.backends:
            raise InputError(
                f"--backends {backends} differs from the backends {path} was converted for "
                f"({','.join(opt.backends)}); convert the model again to change them"
            )
        return opt
    return flowrt.optimize(
        flowrt.onnx.load(path), backends=_backends(backends or "CpuRef"), options=options, registry=registry
    )


def _parse_inputs(items: Sequence[str]) -> dict[str, np.ndarray]:
    feeds = {}
    for item in items:
        name, sep, path = item.partition("=")
        if not sep or not name or not path:
            raise InputError(f"--input expects NAME=FILE.npy, got {item!r}")
        try:
            feeds[name] = np.load(path, allow_pickle=False)
        except (OSError, ValueError) as e:
            raise InputError(f"--input {name}: cannot read {path}: {e}") from e
    return feeds


def _top5(name: str, array: np.ndarray) -> list[str]:
    scores = array.reshape(-1)
    if array.ndim < 1 or scores.size < 5 or array.dtype.kind != "f":
        return []
    best = np.argsort(scores)[::-1][:5]
    return [f"top-5 of {name}:"] + [f"  class {int(i):>4}  score {float(scores[i]):.6f}" for i in best]


async def _run(
    model_path: str, feeds_given: dict[str, np.ndarray], backends: str | None, iterations: int, profile: bool
):
    t0 = time.perf_counter()
    opt = _optimized(model_path, backends)
    async with flowrt.Runtime(profiling=profile) as rt:
        model = await rt.load(opt)
        load_s = time.perf_counter() - t0
        unknown = set(feeds_given) - set(model.inputs)
        if unknown:
            raise InputError(
                f"--input names {sorted(unknown)[0]!r}, which the model does not have; its inputs: {', '.join(model.inputs)}"
            )
        feeds = {n: feeds_given.get(n, pattern_input(info)) for n, info in model.inputs.items()}
        latencies, outputs = [], {}
        for _ in range(iterations):
            start = time.perf_counter()
            outputs = await model.run(feeds)
            latencies.append(time.perf_counter() - start)
    return opt, feeds, outputs, latencies, load_s, model.profile()


def cmd_run(args: argparse.Namespace) -> int:
    path = args.model or str(default_model())
    feeds_given = _parse_inputs(args.input)
    if args.iterations < 1:
        raise InputError(f"--iterations must be at least 1, got {args.iterations}")
    opt, feeds, outputs, latencies, load_s, records = trio.run(
        _run, path, feeds_given, args.backends, args.iterations, bool(args.profile)
    )
    print(f"model: {path}")
    print("layers per backend: " + ", ".join(f"{b}={n}" for b, n in opt.backend_counts().items()))
    for name, array in feeds.items():
        source = "given" if name in feeds_given else "pattern"
        print(f"input {name}: {TensorInfo.of(array)} ({source})")
    ms = [t * 1e3 for t in latencies]
    print(f"load: {load_s * 1e3:.1f} ms")
    print(
        f"latency over {len(ms)} run(s): min {min(ms):.2f} ms, median {statistics.median(ms):.2f} ms, max {max(ms):.2f} ms"
    )
    for name, array in outputs.items():
        print(f"output {name}: {TensorInfo.of(array)}")
        for line in _top5(name, array):
            print(line)
    if not feeds_given:
        expected, tolerance = expected_outputs(path), expected_tolerance(path)
        for (name, array), reference in zip(outputs.items(), expected):
            ok = array.shape == reference.shape and np.allclose(array, reference, **tolerance)
            diff = (
                float(np.max(np.abs(array - reference))) if array.shape == reference.shape else float("nan")
            )
            print(
                f"output {name} vs the model's shipped expected output: {'match' if ok else 'MISMATCH'} (max abs diff {diff:.3g})"
            )
    if args.profile:
        write_chrome_trace(records, args.profile)
        print(f"wrote profile trace {args.profile} ({len(records)} workload records)")
        print("top layers by time:")
        for layer, kind, ms, calls in top_layers(records):
            print(f"  {layer:<24} {kind:<18} {ms:>9.3f} ms over {calls} run(s)")
    if args.output_dir:
        out_dir = Path(args.output_dir)
        out_dir.mkdir(parents=True, exist_ok=True)
        for name, array in outputs.items():
            target = out_dir / (name.replace("/", "_") + ".npy")
            np.save(target, array)
            print(f"wrote {target}")
    return 0


async def _memory_report(opt) -> dict[str, dict[str, int]]:
    async with flowrt.Runtime() as rt:
        return (await rt.load(opt, max_in_flight=1)).memory_report()


def _hints(items: Sequence[str]) -> dict[str, str]:
    """``--hint LAYER=BACKEND`` arguments as ``{layer: backend}``."""
    hints = {}
    for item in items:
        layer, sep, backend = item.rpartition("=")
        if not sep or not layer or not backend:
            raise InputError(f"--hint expects LAYER=BACKEND, got {item!r}")
        hints[layer] = backend.strip()
    return hints


def cmd_inspect(args: argparse.Namespace) -> int:
    path = args.model or str(default_model())
    hints = _hints(args.hint)
    if hints and serialize.is_flowrt_file(path):
        raise InputError(f"--hint applies to .onnx models; {path} was optimized when it was converted")
    opt = _optimized(path, args.backends, flowrt.OptimizerOptions(layer_backend_hints=hints))
    print(f"model: {path}")
    print(opt.report())
    if args.memory:
        mib = 2**20
        print("memory per run (MiB):")
        print(f"  {'backend':<10} {'arena':>10} {'no reuse':>10} {'lower bound':>12} {'tensors':>8}")
        for backend, r in trio.run(_memory_report, opt).items():
            print(
                f"  {backend:<10} {r['arena_bytes'] / mib:>10.3f} {r['no_reuse_bytes'] / mib:>10.3f} "
                f"{r['lower_bound_bytes'] / mib:>12.3f} {r['tensors']:>8}"
            )
    return 0


def cmd_convert(args: argparse.Namespace) -> int:
    start = time.perf_counter()
    opt = flowrt.optimize(
        flowrt.onnx.load(args.model), backends=_backends(args.backends), registry=_registry()
    )
    target = args.output or str(Path(args.model).with_suffix(".flowrt"))
    serialize.save(opt, target)
    counts = ", ".join(f"{b}={n}" for b, n in opt.backend_counts().items())
    print(
        f"wrote {target}: {len(opt.graph)} layers ({counts}), {Path(target).stat().st_size / 2**20:.1f} MiB, "
        f"in {(time.perf_counter() - start) * 1e3:.0f} ms"
    )
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    from flowrt.bench import format_results, plot_latencies, run_bench

    path = args.model or str(default_model())
    if args.duration is not None and not 0 < args.duration < math.inf:  # NaN fails both
        never = "" if args.duration <= 0 else " (a finite one: the benchmark would never end)"
        raise InputError(f"--duration must be a positive number of seconds, got {args.duration}{never}")
    if args.iterations < 1 or args.concurrency < 1:
        raise InputError(
            f"--iterations and --concurrency must be at least 1, got {args.iterations} and {args.concurrency}"
        )
    if args.batch < 1:
        raise InputError(f"--batch must be at least 1, got {args.batch}")
    if args.vs not in (None, "onnxruntime"):
        raise InputError(f"--vs takes 'onnxruntime', got {args.vs!r}")
    results = run_bench(
        path,
        _backends(args.backends),
        iterations=args.iterations,
        concurrency=args.concurrency,
        vs_onnxruntime=args.vs == "onnxruntime",
        progress=not args.json,
        duration=args.duration,
        batch=args.batch,
    )
    if args.plot:
        plot_latencies(results, args.plot)
    if args.json:
        print(
            json.dumps(
                {
                    "model": path,
                    "concurrency": args.concurrency,
                    "batch": args.batch,
                    "results": {r.engine: r.summary() for r in results},
                    "notes": {r.engine: r.note for r in results if r.note},
                }
            )
        )
    else:
        print(
            f"model: {path}  backends: {args.backends}  concurrency: {args.concurrency}  batch: {args.batch}"
        )
        print(format_results(results))
        if args.plot:
            print(f"latency plot: {args.plot}")
    return 0


async def _tune(opt: flowrt.OptimizedNetwork, output: str, mode: str, layers: int) -> None:
    from tqdm import tqdm

    from flowrt.workers.gpu.tuner import tuning_progress

    with tqdm(total=layers, desc=f"tuning ({mode})", unit="layer", file=sys.stderr) as bar:
        token = tuning_progress.set(lambda _layer: bar.update(1))
        try:
            async with flowrt.Runtime(cpu_workers=1, tuning_file=output, tuning_mode=mode) as rt:
                await rt.load(opt, max_in_flight=1)
        finally:
            tuning_progress.reset(token)


def cmd_tune(args: argparse.Namespace) -> int:
    from flowrt.workers.gpu.tuning_file import read_tuning_file

    start = time.perf_counter()
    opt = _optimized(args.model, args.backends or "GpuAcc,CpuRef")
    layers = opt.backend_counts().get("GpuAcc", 0)
    if not layers:
        reasons = {a.declined.get("GpuAcc") for a in opt.decisions.values()} - {None}
        raise InputError(
            f"no layer of {args.model} runs on GpuAcc, so there is nothing to tune"
            + (f" (GpuAcc: {sorted(reasons)[0]})" if reasons else "")
        )
    trio.run(_tune, opt, args.output, args.mode, layers)
    entries = read_tuning_file(args.output)
    print(
        f"wrote {args.output}: {len(entries)} tuned local work sizes for {layers} GpuAcc layers "
        f"(mode {args.mode}) in {time.perf_counter() - start:.1f} s"
    )
    return 0


def cmd_backends(args: argparse.Namespace) -> int:
    registry = flowrt.backend_registry().copy()
    dynamic = load_dynamic_backends(registry)
    for bid in registry.ids():
        backend = registry.get(bid)
        major, minor = backend.version
        caps = ", ".join(f"{k}={v}" for k, v in backend.capabilities.items())
        print(f"{bid}  version {major}.{minor}  capabilities: {caps}")
    print(f"CpuAcc's parallel regions: numba's {threading_layer.requested()!r} threading layer")
    if dynamic.found or dynamic.skipped:
        print("dynamic backends:")
        print("\n".join(f"  {line}" for line in format_report(dynamic).splitlines()))
    _print_opencl_devices()
    return 0


def _print_opencl_devices() -> None:
    """GpuAcc's candidate devices: what FLOWRT_OPENCL_DEVICE / Runtime(opencl_device=...) take."""
    from flowrt.workers.gpu import device

    found = device.describe_devices()
    if not found:
        print(f"OpenCL devices: none ({device.unavailable_reason()})")
        return
    print(f"OpenCL devices (GpuAcc takes the one marked *; pick with {device.DEVICE_ENV}=platform:device):")
    for d in found:
        hints = "yes" if d.priority_hints else "no"
        print(
            f" {'*' if d.chosen else ' '} {d.index}  {d.name}  [{d.type}]  {d.platform}, driver "
            f"{d.driver_version}  memory {d.global_memory_bytes / 2**30:.1f} GiB  queue priority hints: {hints}"
        )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="flowrt", description="flowrt: an asynchronous inference engine")
    parser.add_argument("--version", action="version", version=f"flowrt {flowrt.__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    run = sub.add_parser("run", help="run a model and print latency and outputs (default: squeezenet)")
    run.add_argument(
        "model", nargs="?", help="an .onnx or .flowrt file (default: the squeezenet shipped with onnx)"
    )
    run.add_argument(
        "--input",
        action="append",
        default=[],
        metavar="NAME=FILE.npy",
        help="feed an input from a .npy file (repeatable); inputs not given get the deterministic pattern",
    )
    run.add_argument("--output-dir", help="write each output as NAME.npy here")
    run.add_argument(
        "--backends",
        help="comma-separated backend preference list (default: CpuRef; a .flowrt file keeps its own)",
    )
    run.add_argument("--iterations", type=int, default=1, help="how many runs to time (default: 1)")
    run.add_argument(
        "--profile", metavar="TRACE.json", help="record every workload and write a Chrome trace here"
    )
    run.set_defaults(func=cmd_run)

    inspect = sub.add_parser("inspect", help="print each layer's type, output shape and backend")
    inspect.add_argument("model", nargs="?", help="an .onnx or .flowrt file (default: squeezenet)")
    inspect.add_argument(
        "--backends",
        help="comma-separated backend preference list (default: CpuRef; a .flowrt file keeps its own)",
    )
    inspect.add_argument(
        "--memory", action="store_true", help="also plan memory and print the per-backend report"
    )
    inspect.add_argument(
        "--hint",
        action="append",
        default=[],
        metavar="LAYER=BACKEND",
        help="put a layer on a backend of the list (layer_backend_hints; repeatable, .onnx only)",
    )
    inspect.set_defaults(func=cmd_inspect)

    convert = sub.add_parser("convert", help="optimize an ONNX model once and save it as a .flowrt file")
    convert.add_argument("model", help="an .onnx file")
    convert.add_argument("-o", "--output", help="the .flowrt file to write (default: the model's, renamed)")
    convert.add_argument("--backends", default="CpuRef", help="comma-separated backend preference list")
    convert.set_defaults(func=cmd_convert)

    bench = sub.add_parser("bench", help="latency percentiles and throughput, optionally vs ONNX Runtime")
    bench.add_argument("model", nargs="?", help="an .onnx file (default: squeezenet)")
    bench.add_argument("--backends", default="CpuRef", help="comma-separated backend preference list")
    bench.add_argument("--iterations", type=int, default=50, help="requests to time per engine (default: 50)")
    bench.add_argument("--concurrency", type=int, default=1, help="requests in flight at once (default: 1)")
    bench.add_argument(
        "--batch",
        type=int,
        default=1,
        help="samples per request: the model re-batched from its batch of 1 (default: 1); ONNX Runtime "
        "gets the same feeds, or runs N batch-1 runs per request where it refuses them (a note says so)",
    )
    bench.add_argument(
        "--vs", metavar="onnxruntime", help="also run ONNX Runtime, alternating, and print the ratios"
    )
    bench.add_argument(
        "--duration", type=float, help="run for this many seconds instead of --iterations requests"
    )
    bench.add_argument("--plot", metavar="PNG", help="draw the latency distribution (needs matplotlib)")
    bench.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    bench.set_defaults(func=cmd_bench)

    tune = sub.add_parser("tune", help="tune GpuAcc's local work sizes for a model into a tuning file")
    tune.add_argument("model", help="an .onnx or .flowrt file")
    tune.add_argument(
        "--mode", choices=["rapid", "normal", "exhaustive"], default="normal", help="how many sizes to time"
    )
    tune.add_argument(
        "-o", "--output", required=True, help="the msgpack tuning file to write (updated if it exists)"
    )
    tune.add_argument("--backends", help="comma-separated backend preference list (default: GpuAcc,CpuRef)")
    tune.set_defaults(func=cmd_tune)

    backends = sub.add_parser("backends", help="list registered backends and OpenCL devices")
    backends.set_defaults(func=cmd_backends)
    return parser


# Commands whose loads show Runtime.load's progress bar (``flowrt bench --json`` stays quiet).
_LOAD_PROGRESS = ("run", "inspect", "bench")


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    token = load_progress.set(args.command in _LOAD_PROGRESS and not getattr(args, "json", False))
    try:
        return args.func(args)
    except FlowrtError as e:
        print(f"flowrt: error: {type(e).__name__}: {e}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # output piped into `head` and the like
        sys.stderr.close()
        return 0
    except KeyboardInterrupt:
        return _interrupted()
    except BaseExceptionGroup as group:  # Ctrl-C that reached a trio nursery comes out wrapped
        if group.subgroup(KeyboardInterrupt) is None:
            raise
        return _interrupted()
    finally:
        load_progress.reset(token)


def _interrupted() -> int:
    """Ctrl-C: one line, and the shell's exit status for SIGINT (128 + 2), not a traceback."""
    print("flowrt: interrupted", file=sys.stderr)
    return 130


if __name__ == "__main__":
    sys.exit(main())
