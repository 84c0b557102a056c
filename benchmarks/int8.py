"""Quantized inference: flowrt against ONNX Runtime on int8 models made by ONNX Runtime's
quantizer.

    python benchmarks/int8.py [--models resnet50,mobilenet_v2,bert_small] [--iterations 16]
                              [--rounds 2] [--agreement 200] [--threads 2] [--cache DIR]

Needs the zoo extra (``pip install -e '.[zoo]'``). Each model is the zoo's (``zoo_models``:
random weights, the TorchScript exporter), quantized once into the cache with
``onnxruntime.quantization.quantize_static``: QDQ format (QuantizeLinear / DequantizeLinear
around each quantized op), int8 weights per output channel with ``reduce_range`` (7 bits: on
x86 without VNNI, ONNX Runtime's u8 x s8 kernels add products in pairs with int16 saturation,
and full-range weights make them saturate), uint8 activations, calibrated on CALIBRATION
seeded random inputs.

Per model, each engine timed alone as ``zoo.py`` does (``--rounds`` alternated blocks of
``--iterations`` runs after a pause; an engine's latency is its best block's median): ONNX
Runtime on the int8 model, flowrt on the int8 model and flowrt on the float32 model. Then
top-1 agreement on ``--agreement`` seeded random inputs: the argmax over the last axis of the
first output (per image for a classifier, per token for an encoder), flowrt int8 against
ONNX Runtime int8, and ONNX Runtime int8 against its float32 (what quantizing costs, as a
yardstick). The table also counts flowrt's int8 layers that run on CpuRef, by kind.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import Counter
from pathlib import Path

import numpy as np
import trio

sys.path.insert(0, str(Path(__file__).resolve().parent))  # zoo, zoo_models, beside this file

from zoo import (  # noqa: E402
    DEFAULT_CACHE,
    PAUSE_S,
    WARMUP,
    _median_ms,
    cached_path,
    export_zoo,
    flowrt_median_ms,
    ort_session,
)
from zoo_models import ZOO, make_feeds  # noqa: E402

import flowrt  # noqa: E402

MODELS = ("resnet50", "mobilenet_v2", "bert_small")
EXPORTER = "torchscript"
CALIBRATION = 16
FIRST_SEED = 1000  # the agreement's inputs are seeds FIRST_SEED, FIRST_SEED + 1, ...


def quantized_path(cache: Path, name: str) -> Path:
    return cache / f"{name}.{EXPORTER}.int8-qdq.onnx"


def quantize(name: str, float_path: Path, int8_path: Path) -> None:
    """Quantize ``float_path`` into ``int8_path`` as the module doc says (once: cached)."""
    from onnxruntime.quantization import (
        CalibrationDataReader,
        QuantFormat,
        QuantType,
        quantize_static,
    )

    class Calibration(CalibrationDataReader):
        def __init__(self) -> None:
            self.feeds = iter([make_feeds(ZOO[name].inputs, seed=i) for i in range(CALIBRATION)])

        def get_next(self):
            return next(self.feeds, None)

    partial = int8_path.with_suffix(".partial.onnx")
    quantize_static(
        str(float_path),
        str(partial),
        Calibration(),
        quant_format=QuantFormat.QDQ,
        per_channel=True,
        reduce_range=True,
        activation_type=QuantType.QUInt8,
        weight_type=QuantType.QInt8,
    )
    partial.rename(int8_path)


def top1(output: np.ndarray) -> np.ndarray:
    return np.argmax(output.reshape(-1, output.shape[-1]), axis=-1)


async def load(rt, path: Path, backends: list[str]):
    """``path``'s model loaded on ``backends``, and its layers not on the first, by kind."""
    opt = flowrt.optimize(flowrt.onnx.load(str(path)), backends=backends)
    fallback = Counter(
        layer.kind
        for layer in opt.graph.topological_order()
        if layer.backend and layer.backend != backends[0]
    )
    return await rt.load(opt), fallback


async def measure(name: str, args) -> dict:
    """One model's latencies and agreements (see the module doc)."""
    float_path = cached_path(args.cache, name, EXPORTER)
    int8_path = quantized_path(args.cache, name)
    ort_int8, ort_float = ort_session(int8_path, args.threads), ort_session(float_path, args.threads)
    feeds = make_feeds(ZOO[name].inputs)
    row: dict = {"model": name}
    async with flowrt.Runtime(cpu_workers=args.threads) as rt:
        models = {
            "int8": await load(rt, int8_path, args.backends),
            "float32": await load(rt, float_path, args.backends),
        }
        row["fallback"] = models["int8"][1]
        best: dict[str, list[float]] = {"ort int8": [], "flowrt int8": [], "flowrt float32": []}
        for _ in range(args.rounds):
            for label in ("int8", "float32"):
                time.sleep(PAUSE_S)
                ms = await flowrt_median_ms(models[label][0], feeds, WARMUP, args.iterations)
                best[f"flowrt {label}"].append(ms)
            time.sleep(PAUSE_S)
            best["ort int8"].append(
                _median_ms(lambda f: ort_int8.run(None, f), feeds, WARMUP, args.iterations)
            )
        row.update({label: min(values) for label, values in best.items()})
        ours_vs_ort, int8_vs_float = [], []
        for i in range(args.agreement):
            sample = make_feeds(ZOO[name].inputs, seed=FIRST_SEED + i)
            theirs = top1(ort_int8.run(None, sample)[0])
            ours = top1(next(iter((await models["int8"][0].run(sample)).values())))
            ours_vs_ort.append(np.mean(ours == theirs))
            int8_vs_float.append(np.mean(theirs == top1(ort_float.run(None, sample)[0])))
        row["agreement"] = float(np.mean(ours_vs_ort))
        row["ort int8 vs float32"] = float(np.mean(int8_vs_float))
    return row


def format_table(rows: list[dict], args) -> str:
    lines = [
        "| model | ORT int8 ms | flowrt int8 ms | flowrt float32 ms | int8 / ORT int8 | int8 / float32 "
        "| top-1 vs ORT int8 | ORT int8 vs its float32 | int8 layers on CpuRef |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |",
    ]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['model']} | {r['error']} |")
            continue
        fallback = ", ".join(f"{k} {v}" for k, v in r["fallback"].most_common()) or "none"
        lines.append(
            f"| {r['model']} | {r['ort int8']:.2f} | {r['flowrt int8']:.2f} | {r['flowrt float32']:.2f} "
            f"| {r['flowrt int8'] / r['ort int8']:.2f} | {r['flowrt int8'] / r['flowrt float32']:.2f} "
            f"| {r['agreement']:.1%} | {r['ort int8 vs float32']:.1%} | {fallback} |"
        )
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(MODELS), help="comma-separated zoo models")
    parser.add_argument("--iterations", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--agreement", type=int, default=200, help="random inputs for top-1 agreement")
    parser.add_argument("--threads", type=int, default=2, help="flowrt's CPU workers, ORT's intra-op threads")
    parser.add_argument("--backends", default="CpuAcc,CpuRef")
    parser.add_argument("--cache", type=Path, default=DEFAULT_CACHE)
    args = parser.parse_args(argv)
    args.models = args.models.split(",")
    unknown = [m for m in args.models if m not in ZOO]
    if unknown:
        parser.error(f"unknown model(s) {', '.join(unknown)}; the zoo has {', '.join(ZOO)}")
    args.backends = args.backends.split(",")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    import onnxruntime as ort

    ort.set_default_logger_severity(3)
    failed = export_zoo(args.models, [EXPORTER], args.cache)
    rows = []
    for name in args.models:
        if (name, EXPORTER) in failed:
            rows.append({"model": name, "error": f"export failed: {failed[name, EXPORTER]}"})
            continue
        int8_path = quantized_path(args.cache, name)
        if not int8_path.exists():
            print(f"quantizing {name}", file=sys.stderr, flush=True)
            quantize(name, cached_path(args.cache, name, EXPORTER), int8_path)
        print(f"measuring {name}", file=sys.stderr, flush=True)
        rows.append(trio.run(measure, name, args))
    print(
        f"backends {','.join(args.backends)}; {args.threads} threads each; per engine, the best of "
        f"{args.rounds} alternated blocks' medians of {args.iterations} runs; top-1 agreement on "
        f"{args.agreement} random inputs\n"
    )
    print(format_table(rows, args))


if __name__ == "__main__":
    np.seterr(all="ignore")
    main()
