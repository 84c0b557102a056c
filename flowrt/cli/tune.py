"""``flowrt tune``: load a model on GpuAcc with the tuner on and write the tuned local work sizes
and GEMM plans."""

from __future__ import annotations

import argparse
import sys
import time

import trio

import flowrt
from flowrt.cli import checks
from flowrt.cli.model import open_model
from flowrt.errors import InputError

# An .onnx model is tuned on these unless --backends says otherwise (a .flowrt file keeps its own).
DEFAULT_BACKENDS = ["GpuAcc", "CpuRef"]


async def _tune(opt: flowrt.OptimizedNetwork, output: str, mode: str, layers: int, bars: bool) -> None:
    from tqdm import tqdm

    from flowrt.workers.gpu.tuner import tuning_progress

    with tqdm(total=layers, desc=f"tuning ({mode})", unit="layer", file=sys.stderr, disable=not bars) as bar:
        token = tuning_progress.set(lambda _layer: bar.update(1))
        try:
            async with flowrt.Runtime(cpu_workers=1, tuning_file=output, tuning_mode=mode) as rt:
                await rt.load(opt, max_in_flight=1)
        finally:
            tuning_progress.reset(token)


def command(args: argparse.Namespace) -> int:
    """``flowrt tune``: see the module docstring."""
    checks.model_file(args.model)
    checks.output_file("--output", args.output)
    start = time.perf_counter()
    opt = open_model(args.model, args.backends, default=DEFAULT_BACKENDS)
    layers = opt.backend_counts().get("GpuAcc", 0)
    if not layers:
        reasons = {a.declined["GpuAcc"] for a in opt.decisions.values() if "GpuAcc" in a.declined}
        why = f" (GpuAcc: {sorted(reasons)[0]})" if reasons else ""
        if "GpuAcc" not in opt.backends:
            why = f" (it runs on {','.join(opt.backends)})"
        raise InputError(f"no layer of {args.model} runs on GpuAcc, so there is nothing to tune{why}")
    trio.run(_tune, opt, args.output, args.mode, layers, args.bars)

    from flowrt.workers.gpu.tuning_file import PLAN, read_tuning_file

    entries = read_tuning_file(args.output)
    plans = sum(key[2].endswith(PLAN) for key in entries)
    print(
        f"wrote {args.output}: {len(entries) - plans} tuned local work sizes and {plans} GEMM plans "
        f"for {layers} GpuAcc layers (mode {args.mode}) in {time.perf_counter() - start:.1f} s"
    )
    return 0
