"""``flowrt run``: load a model, run it N times, print latency and outputs (Arm NN's ExecuteNetwork)."""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import numpy as np
import trio

import flowrt
from flowrt import progress
from flowrt.cli import checks
from flowrt.cli.model import check_inputs, feeds_for, input_infos, open_model, optimizer_flags
from flowrt.models import default_model, expected_outputs, expected_tolerance
from flowrt.profiling import top_layers, write_chrome_trace
from flowrt.types import TensorInfo


def _check(args: argparse.Namespace) -> dict[str, np.ndarray]:
    """Every option checked before the model is opened; the --input arrays."""
    checks.at_least_one("--iterations", args.iterations)
    checks.threads(args.threads)
    if args.output_dir:
        checks.output_dir("--output-dir", args.output_dir)
    if args.profile:
        checks.output_file("--profile", args.profile)
    checks.model_file(args.model)
    return checks.input_files(args.input)


async def _run(opt: flowrt.OptimizedNetwork, feeds: dict, args: argparse.Namespace):
    """Load ``opt`` and run it ``args.iterations`` times: (outputs, latencies, load seconds,
    profile records, CPU workers)."""
    from tqdm import tqdm

    start = time.perf_counter()
    async with flowrt.Runtime(profiling=bool(args.profile), cpu_workers=args.threads) as rt:
        model = await rt.load(opt)
        load_s = time.perf_counter() - start
        latencies, outputs = [], {}
        with tqdm(
            total=args.iterations,
            desc="running",
            unit="run",
            leave=False,
            delay=progress.SHOW_AFTER,
            disable=not (args.bars and args.iterations > 1),
        ) as bar:
            for _ in range(args.iterations):
                begun = time.perf_counter()
                outputs = await model.run(feeds)
                latencies.append(time.perf_counter() - begun)
                bar.update()
    return outputs, latencies, load_s, model.profile(), rt.cpu_workers


# A shipped output whose every value is equal is a uniform softmax over equal logits: the light
# squeezenet's constant weights make them all ~1e10, where one rounding step between channels
# (CpuAcc's and ONNX's GEMMs sum in different orders) turns the uniform output into a spike.
_UNIFORM_NOTE = (
    "  (the expected output is uniform: equal logits, here so large that summing in another order "
    "changes which win; --backends CpuRef sums as the reference does)"
)


def _print_outputs(path: str, outputs: dict[str, np.ndarray], compare: bool) -> None:
    for name, array in outputs.items():
        print(f"output {name}: {TensorInfo.of(array)}")
        scores = array.reshape(-1)
        if array.ndim >= 1 and scores.size >= 5 and array.dtype.kind == "f":
            print(f"top-5 of {name}:")
            for i in np.argsort(scores)[::-1][:5]:
                print(f"  class {int(i):>4}  score {float(scores[i]):.6f}")
    if not compare:
        return
    expected, tolerance = expected_outputs(path), expected_tolerance(path)
    for (name, array), reference in zip(outputs.items(), expected):
        same_shape = array.shape == reference.shape
        ok = same_shape and np.allclose(array, reference, **tolerance)
        diff = float(np.max(np.abs(array - reference))) if same_shape else float("nan")
        verdict = "match" if ok else "MISMATCH"
        print(f"output {name} vs the model's shipped expected output: {verdict} (max abs diff {diff:.3g})")
        if not ok and same_shape and reference.size > 1 and np.ptp(reference) == 0:
            print(_UNIFORM_NOTE)


def _write(args: argparse.Namespace, outputs: dict[str, np.ndarray], records) -> None:
    """The --profile trace and the --output-dir arrays; an OSError is one line naming the option."""
    if args.profile:
        with checks.writing("--profile", args.profile):
            write_chrome_trace(records, args.profile)
        print(f"wrote profile trace {args.profile} ({len(records)} workload records)")
        print("top layers by time:")
        for layer, kind, ms, calls in top_layers(records):
            print(f"  {layer:<24} {kind:<18} {ms:>9.3f} ms over {calls} run(s)")
    if args.output_dir:
        out_dir = Path(args.output_dir)
        with checks.writing("--output-dir", out_dir):
            out_dir.mkdir(parents=True, exist_ok=True)
        for name, array in outputs.items():
            target = out_dir / (name.replace("/", "_") + ".npy")
            with checks.writing("--output-dir", target):
                np.save(target, array)
            print(f"wrote {target}")


def command(args: argparse.Namespace) -> int:
    """``flowrt run``: see the module docstring."""
    args.model = args.model or str(default_model())
    given = _check(args)
    start = time.perf_counter()
    opt = open_model(args.model, args.backends, flags=optimizer_flags(args))
    check_inputs(opt, given)
    open_s = time.perf_counter() - start
    feeds = feeds_for(input_infos(opt), given)
    outputs, latencies, load_s, records, workers = trio.run(_run, opt, feeds, args)
    print(f"model: {args.model}")
    print("layers per backend: " + ", ".join(f"{b}={n}" for b, n in opt.backend_counts().items()))
    print(f"threads: {workers} CPU workers")
    for name, array in feeds.items():
        print(f"input {name}: {TensorInfo.of(array)} ({'given' if name in given else 'pattern'})")
    ms = [t * 1e3 for t in latencies]
    print(f"load: {(open_s + load_s) * 1e3:.1f} ms")
    print(
        f"latency over {len(ms)} run(s): min {min(ms):.2f} ms, median {statistics.median(ms):.2f} ms, "
        f"max {max(ms):.2f} ms"
    )
    _print_outputs(args.model, outputs, compare=not given)
    _write(args, outputs, records)
    return 0
