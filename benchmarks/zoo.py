"""Public model zoo: flowrt vs ONNX Runtime on real architectures with random weights.

    python benchmarks/zoo.py [--models a,b] [--exporter torchscript|dynamo|both] [--iterations 10]
                             [--threads 2] [--backends CpuAcc,CpuRef] [--cache DIR] [--refresh]
    python benchmarks/zoo.py --export-test-models tests/integration/zoo

Needs the zoo extra (``pip install -e '.[zoo]'``: torch, torchvision, transformers, onnxscript).
Each architecture of ``zoo_models.ZOO`` is built with seeded random weights (nothing is
downloaded) and exported with the TorchScript exporter (opset 17) and the dynamo exporter
(opset 18), static shapes, into the cache (``~/.cache/flowrt-zoo``); a cached file is not
exported again (``--refresh`` after changing a model). The exports run in a child process, so
that torch's threads never share the cores with the timed engines. An export that fails is
reported with the exporter's error; the other exporter's file is still measured.

For each exported file: ONNX Runtime (CPUExecutionProvider, ``--threads`` intra-op threads)
gives the expected outputs on seeded inputs, and flowrt (``Runtime(cpu_workers=--threads)``)
must match them within TOLERANCE, or the model is marked WRONG. Then each engine is timed
alone, in ``--rounds`` rounds: a block of warm-up runs then ``--iterations`` timed runs of
flowrt, a pause of PAUSE_S, the same block of ONNX Runtime, a pause. Each engine's latency
is the lowest of its blocks' medians: on a machine shared with other tenants one engine's
block can land in a busy second, and the best block of each is what each does on cores it
has to itself. Prints a markdown table — latencies, the
ratio flowrt / ONNX Runtime (lower is better for flowrt), the layers not on the first backend
(falling back to CpuRef), the largest errors — then what failed, the fallback layers by kind
across the zoo, and the geometric mean of the ratios of the models that matched.
"""

from __future__ import annotations

import argparse
import math
import multiprocessing
import statistics
import sys
import time
from collections import Counter
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import trio

sys.path.insert(0, str(Path(__file__).resolve().parent))  # zoo_models, beside this file

from zoo_models import EXPORTERS, TEST_MODELS, ZOO, export, export_all, first_line, make_feeds  # noqa: E402

import flowrt  # noqa: E402

TOLERANCE = {"rtol": 1e-3, "atol": 1e-4}  # atol is a fraction of the output's largest |value|
WARMUP = 3
PAUSE_S = 0.5  # long enough for the other engine's idle threads to stop spinning
DEFAULT_CACHE = Path("~/.cache/flowrt-zoo").expanduser()


@dataclass
class ZooResult:
    """One exported file's figures; ``status`` is ok, WRONG, or where it failed."""

    model: str
    exporter: str
    status: str = "ok"
    detail: str = ""
    flowrt_ms: float = math.nan
    ort_ms: float = math.nan
    layers: int = 0
    fallback_kinds: Counter[str] = field(default_factory=Counter)
    fallback_reasons: dict[str, str] = field(default_factory=dict)
    max_abs: float = math.nan
    max_rel: float = math.nan

    @property
    def ratio(self) -> float:
        return self.flowrt_ms / self.ort_ms


def cached_path(cache: Path, name: str, exporter: str) -> Path:
    return cache / f"{name}.{exporter}.onnx"


def export_zoo(names: list[str], exporters: list[str], cache: Path, refresh: bool = False) -> dict:
    """Export the files not in ``cache`` (all with ``refresh``) in a child process that alone
    imports torch; returns ``{(name, exporter): error}`` for the exports that failed."""
    todo = [(n, e) for n in names for e in exporters if refresh or not cached_path(cache, n, e).exists()]
    if not todo:
        return {}
    jobs = [(n, e, str(cached_path(cache, n, e))) for n, e in todo]
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        return pool.submit(export_all, jobs).result()


def compare_outputs(got: dict[str, np.ndarray], expected: dict[str, np.ndarray]) -> tuple[float, float, bool]:
    """(largest absolute error, largest error relative to the output's scale, within TOLERANCE)
    over every expected output; the scale of an output is its largest |value|."""
    worst_abs, worst_rel, ok = 0.0, 0.0, True
    for name, want in expected.items():
        have = got.get(name)
        if have is None or have.shape != want.shape:
            return math.inf, math.inf, False
        want64, have64 = want.astype(np.float64), have.astype(np.float64)
        scale = max(float(np.max(np.abs(want64), initial=0.0)), 1e-30)
        err = np.abs(have64 - want64)
        ok &= bool(np.all(err <= TOLERANCE["atol"] * scale + TOLERANCE["rtol"] * np.abs(want64)))
        biggest = float(np.max(err, initial=0.0)) if not np.isnan(err).any() else math.nan
        worst_abs, worst_rel = max(worst_abs, biggest), max(worst_rel, biggest / scale)
    return worst_abs, worst_rel, ok


def ort_session(path: Path, threads: int):
    """ONNX Runtime as its users run it: CPU provider, ``threads`` intra-op threads (which spin
    as by default: each engine is timed alone)."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def _median_ms(run, feeds, warmup: int, iterations: int) -> float:
    for _ in range(warmup):
        run(feeds)
    times = []
    for _ in range(iterations):
        start = time.perf_counter()
        run(feeds)
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


async def flowrt_median_ms(model, feeds, warmup: int, iterations: int) -> float:
    """:func:`_median_ms` of a loaded flowrt model's runs."""
    times = []
    for _ in range(warmup + iterations):
        start = time.perf_counter()
        await model.run(feeds)
        times.append(time.perf_counter() - start)
    return statistics.median(times[warmup:]) * 1e3


async def _flowrt(result: ZooResult, path: Path, feeds, expected, args, ort_block) -> None:
    """Check flowrt's outputs, then ``args.rounds`` rounds of a flowrt block and an ONNX
    Runtime block (``ort_block()``, its block median in ms), a pause before each."""
    opt = flowrt.optimize(flowrt.onnx.load(str(path)), backends=args.backends)
    layers = [layer for layer in opt.graph.topological_order() if layer.backend]
    result.layers = len(layers)
    for layer in layers:
        if layer.backend != args.backends[0]:
            result.fallback_kinds[layer.kind] += 1
            declined = opt.decisions[layer.name].declined if layer.name in opt.decisions else {}
            result.fallback_reasons.setdefault(layer.kind, declined.get(args.backends[0], ""))
    async with flowrt.Runtime(cpu_workers=args.threads) as rt:
        model = await rt.load(opt)
        outputs = await model.run(feeds)
        result.max_abs, result.max_rel, ok = compare_outputs(outputs, expected)
        if not ok:
            result.status, result.detail = (
                "WRONG",
                f"largest error {result.max_rel:.1e} of the output's scale",
            )
        ours, theirs = [], []
        for _ in range(args.rounds):
            time.sleep(PAUSE_S)
            ours.append(await flowrt_median_ms(model, feeds, WARMUP, args.iterations))
            time.sleep(PAUSE_S)
            theirs.append(ort_block())
        result.flowrt_ms, result.ort_ms = min(ours), min(theirs)


def run_model(name: str, exporter: str, path: Path, args) -> ZooResult:
    """Check flowrt against ONNX Runtime on one exported file, then time each alone."""
    result = ZooResult(name, exporter)
    feeds = make_feeds(ZOO[name].inputs if name in ZOO else TEST_MODELS[name].inputs)
    try:
        session = ort_session(path, args.threads)
        names = [o.name for o in session.get_outputs()]
        expected = dict(zip(names, session.run(None, feeds)))
    except Exception as error:  # a peer's failure is a row of the report
        result.status, result.detail = "ORT failed", first_line(error)
        return result

    def ort_block() -> float:
        return _median_ms(lambda f: session.run(None, f), feeds, WARMUP, args.iterations)

    try:
        trio.run(_flowrt, result, path, feeds, expected, args, ort_block)
    except Exception as error:  # so is flowrt's: the zoo goes on to the next model
        result.status, result.detail = "flowrt failed", first_line(error)
        result.ort_ms = ort_block()
    return result


def _fmt(value: float, spec: str) -> str:
    return "-" if math.isnan(value) else format(value, spec)


def format_table(results: list[ZooResult], backends: list[str]) -> str:
    """The markdown table of the results, one row per exported file."""
    later = ",".join(backends[1:]) or "later backends"
    lines = [
        f"| model | exporter | flowrt ms | ORT ms | flowrt/ORT | on {later} / layers | max abs err | max rel err "
        "| status |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |",
    ]
    for r in results:
        fallbacks = f"{sum(r.fallback_kinds.values())}/{r.layers}" if r.layers else "-"
        lines.append(
            f"| {r.model} | {r.exporter} | {_fmt(r.flowrt_ms, '.2f')} | {_fmt(r.ort_ms, '.2f')} "
            f"| {_fmt(r.ratio, '.2f')} | {fallbacks} | {_fmt(r.max_abs, '.1e')} | {_fmt(r.max_rel, '.1e')} "
            f"| {r.status} |"
        )
    return "\n".join(lines)


def format_summary(results: list[ZooResult]) -> str:
    """What failed, the fallback layers by kind across the zoo, and the geometric mean."""
    lines = [f"- {r.model} ({r.exporter}): {r.status}: {r.detail}" for r in results if r.detail]
    kinds: Counter[str] = Counter()
    reasons: dict[str, str] = {}
    for r in results:
        kinds.update(r.fallback_kinds)
        for kind, reason in r.fallback_reasons.items():
            reasons.setdefault(kind, reason)
    if kinds:
        lines.append("\nlayers on a later backend, by kind (all files): ")
        lines += [f"- {kind}: {count} ({reasons[kind]})" for kind, count in kinds.most_common()]
    ratios = [r.ratio for r in results if r.status == "ok" and r.ratio > 0]
    if ratios:
        geomean = math.exp(sum(map(math.log, ratios)) / len(ratios))
        lines.append(f"\ngeometric mean of flowrt/ORT over {len(ratios)} matching files: {geomean:.2f}")
    return "\n".join(lines)


def run_zoo(args) -> list[ZooResult]:
    """Export what is missing, then check and time every file; ``args`` as ``main`` parses."""
    export_errors = export_zoo(args.models, args.exporters, args.cache, args.refresh)
    results = []
    for name in args.models:
        for exporter in args.exporters:
            if (name, exporter) in export_errors:
                results.append(ZooResult(name, exporter, "export failed", export_errors[name, exporter]))
                continue
            results.append(run_model(name, exporter, cached_path(args.cache, name, exporter), args))
            print(f"{name} ({exporter}): {results[-1].status}", file=sys.stderr, flush=True)
    return results


def export_test_models(directory: Path) -> None:
    """Export ``TEST_MODELS`` with both exporters into ``directory`` (the CI test's files)."""
    for model in TEST_MODELS.values():
        for exporter in EXPORTERS:
            path = directory / f"{model.name}.{exporter}.onnx"
            try:
                export(model, exporter, path)
                print(f"{path}: {path.stat().st_size / 1024:.0f} KB")
            except Exception as error:  # an exporter that cannot take a model is a fact to report
                print(f"{model.name} ({exporter}): export failed: {first_line(error)}")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(ZOO), help="comma-separated, of: " + ", ".join(ZOO))
    parser.add_argument("--exporter", choices=[*EXPORTERS, "both"], default="both")
    parser.add_argument("--iterations", type=int, default=10)
    parser.add_argument(
        "--rounds", type=int, default=3, help="blocks of each engine, alternated; the best block counts"
    )
    parser.add_argument(
        "--threads", type=int, default=2, help="flowrt's CPU workers and ORT's intra-op threads"
    )
    parser.add_argument("--backends", default="CpuAcc,CpuRef")
    parser.add_argument("--cache", type=Path, default=DEFAULT_CACHE)
    parser.add_argument("--refresh", action="store_true", help="export again even when cached")
    parser.add_argument("--export-test-models", type=Path, metavar="DIR")
    args = parser.parse_args(argv)
    args.models = args.models.split(",")
    unknown = [m for m in args.models if m not in ZOO]
    if unknown:
        parser.error(f"unknown model(s) {', '.join(unknown)}; the zoo has {', '.join(ZOO)}")
    args.exporters = list(EXPORTERS) if args.exporter == "both" else [args.exporter]
    args.backends = args.backends.split(",")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.export_test_models:
        export_test_models(args.export_test_models)
        return
    import onnxruntime as ort

    ort.set_default_logger_severity(3)
    results = run_zoo(args)
    print(
        f"backends {','.join(args.backends)}; {args.threads} threads each; per engine, the best of "
        f"{args.rounds} alternated blocks' medians of {args.iterations} runs\n"
    )
    print(format_table(results, args.backends))
    print(format_summary(results))


if __name__ == "__main__":
    np.seterr(all="ignore")
    main()
