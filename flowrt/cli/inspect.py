"""``flowrt inspect``: where each layer runs and why, a summary first and every layer with --layers."""

from __future__ import annotations

import argparse
from collections.abc import Sequence

import trio

import flowrt
from flowrt import serialize
from flowrt.cli import checks
from flowrt.cli.model import open_model, optimizer_flags
from flowrt.engine.graph.report import format_details, format_summary
from flowrt.errors import InputError
from flowrt.models import default_model, pattern_input
from flowrt.profiling import ProfileRecord


def _hints(items: Sequence[str]) -> dict[str, str]:
    """``--hint LAYER=BACKEND`` arguments as ``{layer: backend}``."""
    hints = {}
    for item in items:
        layer, sep, backend = item.rpartition("=")
        if not sep or not layer or not backend:
            raise InputError(f"--hint expects LAYER=BACKEND, got {item!r}")
        hints[layer] = backend.strip()
    return hints


async def _memory_report(opt: flowrt.OptimizedNetwork) -> dict[str, dict[str, int]]:
    async with flowrt.Runtime() as rt:
        return (await rt.load(opt, max_in_flight=1)).memory_report()


def _print_memory(opt: flowrt.OptimizedNetwork) -> None:
    mib = 2**20
    print("memory per run (MiB):")
    print(f"  {'backend':<10} {'arena':>10} {'no reuse':>10} {'lower bound':>12} {'tensors':>8}")
    for backend, r in trio.run(_memory_report, opt).items():
        print(
            f"  {backend:<10} {r['arena_bytes'] / mib:>10.3f} {r['no_reuse_bytes'] / mib:>10.3f} "
            f"{r['lower_bound_bytes'] / mib:>12.3f} {r['tensors']:>8}"
        )


# A pool's runs: the first runs each layer's code, the second records its launches, the third
# replays them (profiled, layer by layer): what every later run enqueues.
_RUNS_TO_STEADY = 3


async def _launches(opt: flowrt.OptimizedNetwork) -> list[ProfileRecord]:
    """The profile records of the device layers in a steady run of ``opt`` on pattern inputs."""
    async with flowrt.Runtime() as rt:
        model = await rt.load(opt, max_in_flight=1)
        feeds = {name: pattern_input(info) for name, info in model.inputs.items()}
        for run in range(_RUNS_TO_STEADY):
            await model.run(feeds, profile=run == _RUNS_TO_STEADY - 1)
        on_device = {node.layer for s in model.dataflow.segments if s.device for node in s.nodes}
        return [r for r in model.profile() if r.layer in on_device]


def _print_launches(opt: flowrt.OptimizedNetwork) -> None:
    devices = trio.run(_launches, opt)
    if not devices:
        print("kernel launches a run: none (no layer runs on a device backend)")
        return
    for backend in dict.fromkeys(r.backend for r in devices):
        mine = [r for r in devices if r.backend == backend]
        print(f"kernel launches a run on {backend}: {sum(r.launches for r in mine)} for {len(mine)} layers")
        by_kind: dict[str, list[int]] = {}
        for r in mine:
            by_kind.setdefault(r.kind, []).append(r.launches)
        for kind, counts in sorted(by_kind.items(), key=lambda item: -sum(item[1])):
            print(f"  {kind:<24} {sum(counts):>6} launches  {len(counts):>5} layers")


async def _stream_choice(opt: flowrt.OptimizedNetwork, hint: str) -> str:
    async with flowrt.Runtime() as rt:
        model = await rt.load(opt, hint=hint)
        async with model.stream() as stream:
            choice = stream.choice
    batching = f", max_batch={choice.max_batch}, max_delay={choice.max_delay * 1e3:.2f} ms"
    return (
        f"model.stream(hint={hint!r}) chooses max_in_flight={choice.max_in_flight}"
        f"{batching if choice.max_batch > 1 else ', unbatched'}\n  because {choice.reason}"
    )


def command(args: argparse.Namespace) -> int:
    """``flowrt inspect``: see the module docstring."""
    path = checks.model_file(args.model or str(default_model()))
    hints = _hints(args.hint)
    if hints and serialize.is_flowrt_file(path):
        raise InputError(f"--hint applies to .onnx models; {path} was optimized when it was converted")
    opt = open_model(
        path,
        args.backends,
        options=flowrt.OptimizerOptions(layer_backend_hints=hints),
        flags=optimizer_flags(args),
    )
    print(f"model: {path}")
    print(format_summary(opt))
    if args.layers:
        print(format_details(opt))
    else:
        print("(every layer, the graph passes and substitutions: flowrt inspect --layers)")
    if args.memory:
        _print_memory(opt)
    if args.launches:
        _print_launches(opt)
    if args.stream_hint:
        print(trio.run(_stream_choice, opt, args.stream_hint))
    return 0
