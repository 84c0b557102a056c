"""``flowrt convert``: optimize an ONNX model once and save it as a .flowrt file."""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from flowrt import serialize
from flowrt.cli import checks
from flowrt.cli.model import open_model, optimizer_flags
from flowrt.errors import InputError


def command(args: argparse.Namespace) -> int:
    """``flowrt convert``: see the module docstring."""
    checks.model_file(args.model)
    if serialize.is_flowrt_file(args.model):
        raise InputError(f"{args.model} is already a .flowrt file; flowrt convert takes an .onnx model")
    target = args.output or str(Path(args.model).with_suffix(".flowrt"))
    checks.output_file("--output", target)
    start = time.perf_counter()
    opt = open_model(args.model, args.backends, flags=optimizer_flags(args))
    with checks.writing("--output", target):
        serialize.save(opt, target)
    counts = ", ".join(f"{b}={n}" for b, n in opt.backend_counts().items())
    print(
        f"wrote {target}: {len(opt.graph)} layers ({counts}), {Path(target).stat().st_size / 2**20:.1f} MiB, "
        f"in {(time.perf_counter() - start) * 1e3:.0f} ms"
    )
    return 0
