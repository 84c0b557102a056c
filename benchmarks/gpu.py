"""Models (resnet50 by default) on GpuAcc against PyTorch eager on CUDA, fp32 and fp16.

    python benchmarks/gpu.py [--models resnet50,densenet121,vit_small,bert_small] [--batches 1,8]
                             [--iterations 50] [--concurrency 1,2] [--record-launches on,off]
                             [--feeds host,pinned,device]
                             [--load-times]

Each model (``--models``) is built with random weights (seed 0): an architecture of the model
zoo (``zoo_models.ZOO``: torchvision CNNs, a ViT, BERT-, GPT- and Llama-like encoders and
decoders, with the zoo's inputs at the batch size asked), or any other name of
``torchvision.models`` on 224x224 images. It is exported to ONNX once per batch size (opset
17, the TorchScript exporter) and optimized for ``GpuAcc,CpuRef``; PyTorch runs the same
module eagerly on CUDA with TF32 off (``torch.backends.cuda.matmul.allow_tf32`` and
``torch.backends.cudnn.allow_tf32``), so both sides compute in fp32, and again under
``torch.autocast("cuda", dtype=torch.float16)`` ("torch fp16 ms": PyTorch's mixed precision,
the peer of GpuAcc's half-precision storage). PyTorch runs in a child process, so CUDA and
the OpenCL driver never share one. For each batch size it prints the median latency and the
throughput of each engine, flowrt's throughput as a fraction of PyTorch's, and the largest
difference between their first outputs. PyTorch is timed on inputs already on the GPU, its
output left there; "torch host ms" is PyTorch from the host arrays to a host array, as
flowrt's ``run`` is timed. ``--concurrency C`` keeps C flowrt runs in flight (C memory
pools), which overlaps one run's host work with another's device work. ``--feeds host,pinned``
runs flowrt also with its feeds and outputs in page-locked arrays (``model.pinned_array``:
copied to and from the device with no staging copy on the host; the feeds are copied there
once, before the timing); ``device`` runs it with its feeds already on the device
(``model.device_array``, made once) and its outputs left there (``run(...,
device_outputs=True)``): what "torch ms" times of PyTorch. ``--storage fp32,fp16``
(the default) runs flowrt as exported and with ``OptimizerOptions(reduce_fp32_to_fp16=True)``,
where GpuAcc stores tensors and weights as half and computes in float ("fp16/fp32 flowrt":
the second's throughput over the first's).

It also prints flowrt's kernel launches per run and the host time per launch (the time
the queue actor spends enqueueing a run's GPU segments, transfers included, over its
launches, from five runs). ``--record-launches on,off`` runs flowrt with GpuAcc's recorded launches
(the default, see ``flowrt.workers.gpu.launches``) and without, in the same process.

``--load-times`` starts two fresh processes one after the other (the first model of
``--models``, batch 1), sharing an empty program cache (``FLOWRT_CACHE_DIR``): the first builds GpuAcc's programs from source (cold), the
second from the cached binaries (warm). Each prints its optimize + load time and how every
program was built.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import trio

import flowrt

BACKENDS = ["GpuAcc", "CpuRef"]


sys.path.insert(0, str(Path(__file__).resolve().parent))  # zoo_models, beside this file

from zoo_models import ZOO, make_feeds  # noqa: E402


def _torch_model(name: str = "resnet50"):
    """A torchvision model with random weights (seed 0), in eval mode."""
    import torch
    import torchvision

    torch.manual_seed(0)
    return getattr(torchvision.models, name)(weights=None).eval()


def _model_and_feeds(name: str, batch: int) -> tuple[Any, dict[str, np.ndarray]]:
    """The module of ``name`` and seeded feeds at ``batch``: a zoo architecture with its inputs,
    else a torchvision model on (batch, 3, 224, 224) images."""
    if name in ZOO:
        zoo = ZOO[name]
        inputs = tuple(dataclasses.replace(spec, shape=(batch, *spec.shape[1:])) for spec in zoo.inputs)
        return zoo.build(), make_feeds(inputs, seed=batch)
    x = np.random.default_rng(batch).standard_normal((batch, 3, 224, 224), dtype=np.float32)
    return _torch_model(name), {"data": x}


def _export(model, batch: int, folder: Path, name: str = "resnet50", feeds: dict | None = None) -> str:
    """``model`` exported to ``folder`` at ``batch`` (once): on ``feeds``, or on images."""
    import torch

    path = folder / f"{name}_b{batch}.onnx"
    if not path.exists():
        feeds = feeds or {"data": np.zeros((batch, 3, 224, 224), np.float32)}
        args = tuple(torch.from_numpy(v) for v in feeds.values())
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.onnx.export(model, args, str(path), input_names=list(feeds), output_names=["output"],
                              opset_version=17, dynamo=False)  # fmt: skip
    return str(path)


def _first(out: Any) -> Any:
    """A module's first output tensor (transformers' models return tuples of outputs)."""
    return out if hasattr(out, "cpu") else out[0]


def _torch_latencies(
    model, feeds: dict[str, np.ndarray], iterations: int
) -> tuple[list[float], list[float], list[float], np.ndarray]:
    """PyTorch's latencies on inputs already on the GPU (the output left there), in fp32, then
    under fp16 autocast, then in fp32 from the host arrays to a host array (as flowrt's
    ``run`` is timed), and its fp32 output."""
    import torch

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    gpu_model = model.cuda()
    xs = [torch.from_numpy(v).cuda() for v in feeds.values()]

    def timed(call) -> list[float]:
        for _ in range(5):
            call()
        torch.cuda.synchronize()
        times = []
        for _ in range(iterations):
            start = time.perf_counter()
            call()
            torch.cuda.synchronize()
            times.append(time.perf_counter() - start)
        return times

    def half() -> Any:
        with torch.autocast("cuda", dtype=torch.float16):
            return gpu_model(*xs)

    with torch.inference_mode():
        times = timed(lambda: gpu_model(*xs))
        half_times = timed(half)
        host_times = timed(
            lambda: _first(gpu_model(*(torch.from_numpy(v).cuda() for v in feeds.values()))).cpu()
        )
        result = _first(gpu_model(*xs)).float().cpu().numpy()
    model.cpu()
    return times, half_times, host_times, result


class _LaunchCounter:
    """Counts GpuAcc's launches: through a layer's code, and recorded ones replayed (the
    process's count, ``flowrt.workers.gpu.launches.LAUNCHED``)."""

    @property
    def count(self) -> int:
        from flowrt.workers.gpu import launches

        return launches.LAUNCHED[0]


async def _host_per_launch(model, feeds, counter: _LaunchCounter, runs: int = 5) -> tuple[float, float]:
    """(launches per run, host microseconds per launch) over ``runs`` runs: the time the
    queue actor spends enqueueing the runs' GPU segments (transfers included), per launch."""
    from flowrt.engine.scheduler.device_segments import DeviceSegments

    spent = [0.0]
    enqueue_segment = DeviceSegments.enqueue_segment

    def timed(state, *args, **kwargs):
        # The segment's commands are enqueued as the actor steps its generator: time each step.
        commands = enqueue_segment(state, *args, **kwargs)
        while True:
            start = time.perf_counter()
            try:
                next(commands)
            except StopIteration:
                return
            finally:
                spent[0] += time.perf_counter() - start
            yield

    DeviceSegments.enqueue_segment = timed  # type: ignore[method-assign]
    try:
        before = counter.count
        for _ in range(runs):
            await model.run(feeds)
    finally:
        DeviceSegments.enqueue_segment = enqueue_segment  # type: ignore[method-assign]
    launches = (counter.count - before) / runs
    return launches, spent[0] * 1e6 / runs / max(launches, 1)


async def _flowrt_latencies(
    path: str,
    feeds: dict[str, np.ndarray],
    iterations: int,
    concurrency: int,
    counter: _LaunchCounter,
    half: bool = False,
    io: str = "host",
):
    start = time.perf_counter()
    options = flowrt.OptimizerOptions(reduce_fp32_to_fp16=half)
    opt = flowrt.optimize(flowrt.onnx.load(path), backends=BACKENDS, options=options)
    off_gpu = [name for name, bid in opt.assignments().items() if bid != "GpuAcc"]
    async with flowrt.Runtime() as rt:
        model = await rt.load(opt, max_in_flight=concurrency)
        load_s = time.perf_counter() - start
        bound: list[dict[str, np.ndarray] | None] = [None] * concurrency
        if io == "pinned":  # the feeds copied into page-locked arrays once; each client's outputs its own
            feeds = {n: _pinned_copy(model, v) for n, v in feeds.items()}
            shapes = {n: (i.shape, i.dtype.numpy) for n, i in model.outputs.items() if i is not None}
            bound = [{n: model.pinned_array(*s) for n, s in shapes.items()} for _ in range(concurrency)]
        on_device = io == "device"  # the feeds copied to the device once; the outputs left there
        if on_device:
            feeds = {n: model.device_array(v) for n, v in feeds.items()}
        for _ in range(3):  # every pool's first runs (its programs are made on them), outside the timing
            async with trio.open_nursery() as nursery:
                for _ in range(concurrency):
                    nursery.start_soon(model.run, feeds)
        out = await model.run(feeds)
        times: list[float] = []

        async def client(count: int, outputs: dict[str, np.ndarray] | None) -> None:
            for _ in range(count):
                t0 = time.perf_counter()
                await model.run(feeds, outputs=outputs, device_outputs=on_device)
                times.append(time.perf_counter() - t0)

        wall = time.perf_counter()
        async with trio.open_nursery() as nursery:
            for c in range(concurrency):
                nursery.start_soon(client, iterations // concurrency, bound[c])
        wall = time.perf_counter() - wall
        launches, host_us = await _host_per_launch(model, feeds, counter)
    return times, wall, next(iter(out.values())), load_s, off_gpu, launches, host_us


def _pinned_copy(model, value: np.ndarray) -> np.ndarray:
    array = model.pinned_array(value.shape, value.dtype)
    array[...] = value
    return array


def _torch_in_child(name: str, batch: int, iterations: int, folder: Path) -> tuple[dict, dict, np.ndarray]:
    """PyTorch's median latencies (fp32 device to device, fp16 autocast, fp32 host to host),
    the feeds and the output at ``batch``, measured in a process of its own (so CUDA and the
    OpenCL driver never share one)."""
    data = folder / f"{name}_b{batch}.npz"
    out = subprocess.run([sys.executable, __file__, "--torch-only", name, str(batch), str(iterations), str(folder)],
                         check=True, capture_output=True, text=True).stdout  # fmt: skip
    medians = json.loads(out.strip().splitlines()[-1])
    with np.load(data) as saved:
        feeds = {key[len("feed_") :]: saved[key] for key in saved.files if key.startswith("feed_")}
        return medians, feeds, saved["output"]


def torch_once(name: str, batch: int, iterations: int, folder: Path) -> None:
    """Export model ``name`` at ``batch`` (once), time PyTorch eager on it, save the feeds and
    the output."""
    model, feeds = _model_and_feeds(name, batch)
    _export(model, batch, folder, name, feeds)
    times, half_times, host_times, y = _torch_latencies(model, feeds, iterations)
    np.savez(folder / f"{name}_b{batch}.npz", output=y, **{f"feed_{k}": v for k, v in feeds.items()})
    medians = {
        key: statistics.median(t) for key, t in (("fp32", times), ("fp16", half_times), ("host", host_times))
    }
    print(json.dumps(medians))


def benchmark(
    models: list[str],
    batches: list[int],
    iterations: int,
    concurrencies: list[int],
    folder: Path,
    recording: list[str],
    precisions: list[str],
    ios: list[str],
) -> None:
    from flowrt.workers.gpu import launches

    counter = _LaunchCounter()
    rows = []
    for name, batch in [(m, b) for m in models for b in batches]:
        torch_s, feeds, expected = _torch_in_child(name, batch, iterations, folder)
        path = str(folder / f"{name}_b{batch}.onnx")
        for record, precision, io, concurrency in itertools.product(
            recording, precisions, ios, concurrencies
        ):
            os.environ[launches.ENV] = "1" if record == "on" else "0"
            times, wall, got, load_s, off_gpu, per_run, host_us = trio.run(
                _flowrt_latencies,
                path,
                feeds,
                iterations,
                concurrency,
                counter,
                precision == "fp16",
                io,
            )
            per_s = batch * len(times) / wall
            diff = float(np.max(np.abs(got - expected)) / max(1e-12, float(np.max(np.abs(expected)))))
            rows.append((name, batch, record, precision, io, concurrency, statistics.median(times) * 1e3, per_s,
                         torch_s, diff, per_run, host_us))  # fmt: skip
            off = f"{len(off_gpu)} ({', '.join(off_gpu[:6])}{', ...' if len(off_gpu) > 6 else ''})"
            print(
                f"{name} batch {batch}, recorded launches {record}, {precision}, {io} feeds, {concurrency} in flight: "
                f"load {load_s:.2f} s, layers off GpuAcc: {off if off_gpu else 'none'}"
            )
    print()
    print(
        "| model | batch | recorded launches | storage | feeds | in flight | flowrt ms | flowrt samples/s | torch ms "
        "| torch samples/s | flowrt/torch | torch fp16 ms | flowrt/torch fp16 | fp16/fp32 flowrt | torch host ms "
        "| max rel diff | launches/run | host us/launch |"
    )
    print("| --- | ---: | --- | --- | --- | ---: |" + " ---: |" * 12)
    fp32_rate = {(r[0], r[1], r[2], r[4], r[5]): r[7] for r in rows if r[3] == "fp32"}
    for name, batch, record, precision, io, conc, ms, per_s, torch_s, diff, per_run, host_us in rows:
        torch_per_s, half_per_s = batch / torch_s["fp32"], batch / torch_s["fp16"]
        own = fp32_rate.get((name, batch, record, io, conc)) if precision == "fp16" else None
        print(
            f"| {name} | {batch} | {record} | {precision} | {io} | {conc} | {ms:.2f} | {per_s:.1f} "
            f"| {torch_s['fp32'] * 1e3:.2f} | {torch_per_s:.1f} | {per_s / torch_per_s:.3f} "
            f"| {torch_s['fp16'] * 1e3:.2f} | {per_s / half_per_s:.3f} | {f'{per_s / own:.3f}' if own else ''} "
            f"| {torch_s['host'] * 1e3:.2f} | {diff:.2e} | {per_run:.0f} | {host_us:.1f} |"
        )


def load_once(path: str) -> None:
    """Optimize and load ``path`` on GpuAcc in this process; print the time and program builds."""

    async def main() -> dict:
        start = time.perf_counter()
        opt = flowrt.optimize(flowrt.onnx.load(path), backends=BACKENDS)
        async with flowrt.Runtime() as rt:
            await rt.load(opt)
            load_s = time.perf_counter() - start
            programs = rt._contexts["GpuAcc"].device.programs.builds
            return {"load_s": load_s, "builds": dict(programs)}

    print(json.dumps(trio.run(main)))


def load_times(folder: Path, name: str = "resnet50") -> None:
    model, feeds = _model_and_feeds(name, 1)  # the model the benchmark runs under that name
    path = _export(model, 1, folder, name, feeds)  # exported here; torch's CUDA is never started
    cache = tempfile.mkdtemp(prefix="flowrt-cache-")  # empty: the first process builds from source
    env = dict(os.environ, FLOWRT_CACHE_DIR=cache)
    for label in ("cold", "warm"):
        start = time.perf_counter()
        out = subprocess.run([sys.executable, __file__, "--load-only", path], env=env, check=True,
                             capture_output=True, text=True).stdout  # fmt: skip
        total = time.perf_counter() - start
        result = json.loads(out.strip().splitlines()[-1])
        print(
            f"{label}: optimize + load {result['load_s']:.2f} s, process {total:.2f} s, programs {result['builds']}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--batches", default="1,8")
    parser.add_argument("--iterations", type=int, default=50)
    parser.add_argument("--concurrency", default="1,2")
    parser.add_argument("--load-times", action="store_true")
    parser.add_argument("--record-launches", default="on", help="on, off or on,off")
    parser.add_argument(
        "--storage", default="fp32,fp16", help="fp32 and/or fp16 (reduce_fp32_to_fp16: GpuAcc stores half)"
    )
    parser.add_argument(
        "--feeds",
        default="host",
        help="host, pinned (feeds and outputs in LoadedNetwork.pinned_array) and/or device (feeds "
        "made by LoadedNetwork.device_array once, outputs kept on the device: as PyTorch is timed)",
    )
    parser.add_argument("--load-only", metavar="MODEL", help=argparse.SUPPRESS)
    parser.add_argument("--torch-only", nargs=4, help=argparse.SUPPRESS)
    parser.add_argument(
        "--models", default="resnet50", help="zoo or torchvision model names, comma-separated"
    )
    parser.add_argument("--export-dir", help="where the ONNX exports go (default: a temporary folder)")
    args = parser.parse_args()
    if args.load_only:
        load_once(args.load_only)
        return
    if args.torch_only:
        name, batch, iterations, folder = args.torch_only
        torch_once(name, int(batch), int(iterations), Path(folder))
        return
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(args.export_dir or tmp)
        folder.mkdir(parents=True, exist_ok=True)
        models = [m for m in args.models.split(",") if m]
        if args.load_times:
            load_times(folder, models[0])
        batches = [int(b) for b in args.batches.split(",")]
        concurrencies = [int(c) for c in args.concurrency.split(",")]
        recording = [r for r in args.record_launches.split(",") if r in ("on", "off")]
        precisions = [p for p in args.storage.split(",") if p in ("fp32", "fp16")] or ["fp32"]
        ios = [f for f in args.feeds.split(",") if f in ("host", "pinned", "device")] or ["host"]
        benchmark(
            models, batches, args.iterations, concurrencies, folder, recording or ["on"], precisions, ios
        )


if __name__ == "__main__":
    main()
