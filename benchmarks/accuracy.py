"""How far each engine's outputs are from CpuRef's on the model zoo: fast math, float16 weights.

    python benchmarks/accuracy.py [--models a,b] [--exporter torchscript|dynamo|both]
                                  [--backends CpuAcc] [--cache DIR]

Needs the zoo extra, as ``zoo.py`` (whose exports and cache it shares). For each exported
file, on seeded inputs: CpuRef's outputs (numpy, float32: the reference), then ONNX Runtime's,
then flowrt's on ``--backends`` (CpuRef after them for any layer they decline) optimized by
default, with ``fast_math``, and with ``reduce_fp32_to_fp16`` (CpuAcc keeps the weights of
its Gemm and MatMul layers as float16). A distance is the largest absolute difference from
CpuRef over the outputs, divided by the largest |value| of that output. Prints a markdown
table: the distances, flowrt's (default) divided by ONNX Runtime's (rounding of the same size
reads about 1; 1e-7 of the output is float32's rounding), fast math's effect (on / off), and
the weights the backends made (``memory_report()``'s ``weights_bytes`` and
``shared_weights_bytes``) by default and with float16 weights. No timing.
"""

from __future__ import annotations

import argparse
import functools
import math
import sys
from pathlib import Path

import numpy as np
import trio

sys.path.insert(0, str(Path(__file__).resolve().parent))  # zoo_models and zoo, beside this file

from zoo import DEFAULT_CACHE, cached_path, export_zoo, ort_session  # noqa: E402
from zoo_models import EXPORTERS, ZOO, first_line, make_feeds  # noqa: E402

import flowrt  # noqa: E402


def distance(got: dict[str, np.ndarray], reference: dict[str, np.ndarray]) -> float:
    """The largest |got - reference| over the outputs, each relative to its largest |value|."""
    worst = 0.0
    for name, want in reference.items():
        want64 = np.asarray(want, np.float64)
        scale = float(np.max(np.abs(want64), initial=0.0)) or 1.0
        worst = max(
            worst, float(np.max(np.abs(np.asarray(got[name], np.float64) - want64), initial=0.0)) / scale
        )
    return worst


async def flowrt_outputs(
    path: Path, backends: list[str], feeds, **options
) -> tuple[dict[str, np.ndarray], int]:
    """flowrt's outputs on ``feeds`` with ``OptimizerOptions(**options)``, and the bytes of
    the weights its backends made at load."""
    opt = flowrt.optimize(
        flowrt.onnx.load(str(path)), backends=backends, options=flowrt.OptimizerOptions(**options)
    )
    async with flowrt.Runtime(cpu_workers=2) as rt:
        model = await rt.load(opt)
        outputs = await model.run(feeds)
        report = model.memory_report().values()
        return outputs, sum(r["weights_bytes"] + r["shared_weights_bytes"] for r in report)


def measure(name: str, path: Path, backends: list[str]) -> list[str]:
    """One row of the table: the model, its distances, the two ratios."""
    feeds = make_feeds(ZOO[name].inputs)
    reference, _ = trio.run(flowrt_outputs, path, ["CpuRef"], feeds)
    session = ort_session(path, 2)
    ort = dict(zip([o.name for o in session.get_outputs()], session.run(None, feeds)))
    chain = [*backends, "CpuRef"]
    off, full = trio.run(flowrt_outputs, path, chain, feeds)
    on, _ = trio.run(functools.partial(flowrt_outputs, path, chain, feeds, fast_math=True))
    half, halved = trio.run(functools.partial(flowrt_outputs, path, chain, feeds, reduce_fp32_to_fp16=True))
    d_ort, d_off, d_on = distance(ort, reference), distance(off, reference), distance(on, reference)

    def ratio(a: float, b: float) -> str:
        return f"{a / b:.2f}" if b > 0 else ("1.00" if a == 0 else "inf")

    return [
        f"{d_ort:.1e}", f"{d_off:.1e}", f"{d_on:.1e}", ratio(d_off, d_ort), ratio(d_on, d_off),
        f"{distance(half, reference):.1e}", f"{full / 2**20:.1f} -> {halved / 2**20:.1f}",
    ]  # fmt: skip


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(ZOO), help="comma-separated, of: " + ", ".join(ZOO))
    parser.add_argument("--exporter", choices=[*EXPORTERS, "both"], default="torchscript")
    parser.add_argument("--backends", default="CpuAcc", help="flowrt's backends before CpuRef")
    parser.add_argument("--cache", type=Path, default=DEFAULT_CACHE)
    args = parser.parse_args(argv)
    models = args.models.split(",")
    unknown = [m for m in models if m not in ZOO]
    if unknown:
        parser.error(f"unknown model(s) {', '.join(unknown)}; the zoo has {', '.join(ZOO)}")
    exporters = list(EXPORTERS) if args.exporter == "both" else [args.exporter]
    backends = args.backends.split(",")
    import onnxruntime

    onnxruntime.set_default_logger_severity(3)
    failed = export_zoo(models, exporters, args.cache)
    print(f"distance from CpuRef (largest |difference| / largest |output|); flowrt on {','.join(backends)}\n")
    print(
        "| model | exporter | ORT | flowrt | flowrt fast math | flowrt / ORT | fast / exact "
        "| flowrt fp16 weights | weights MiB (fp32 -> fp16) |"
    )
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    ratios = []
    for name in models:
        for exporter in exporters:
            if (name, exporter) in failed:
                print(f"| {name} | {exporter} | export failed: {failed[name, exporter]} |||||||")
                continue
            try:
                row = measure(name, cached_path(args.cache, name, exporter), backends)
            except Exception as error:  # a model that fails is a row, and the zoo goes on
                print(f"| {name} | {exporter} | failed: {first_line(error)} |||||||", flush=True)
                continue
            if row[3] != "inf":
                ratios.append(float(row[3]))
            print(f"| {name} | {exporter} | " + " | ".join(row) + " |", flush=True)
    if ratios:
        geomean = math.exp(sum(math.log(max(r, 1e-3)) for r in ratios) / len(ratios))
        print(
            f"\nflowrt / ORT: geometric mean {geomean:.2f}, largest {max(ratios):.2f} over {len(ratios)} files"
        )


if __name__ == "__main__":
    np.seterr(all="ignore")
    main()
