"""Streams, pipelines and priorities on flowrt, against ONNX Runtime, in one process.

    python benchmarks/streaming.py [--quick] [--cases streaming,pipeline,priority]
        [--models NAME ...] [--zoo NAME ...] [--requests 128] [--backends CpuAcc,CpuRef] [--rounds 2]

Three cases, each printing requests/s and p50/p99 latency:

- streaming: per light model (as ``compare_ort.py`` finds them), ``--requests`` requests of
  batch 1 through ``model.stream()`` with the settings printed (``--pools``,
  ``--max-in-flight``, ``--max-batch``, ``--max-delay`` change them), against ONNX Runtime
  doing one ``run()`` per request in a loop with ``intra_op_num_threads`` = the cores. The
  requests are sent as fast as the stream takes them; a request's latency runs from the
  moment the stream accepted it to the moment its result is received. Then the geometric mean
  of the requests/s ratios. ``--zoo`` runs the same case on models of the public model zoo
  (``benchmarks/zoo.py``: random weights, seeded inputs, its exporter chosen by
  ``--zoo-exporter``; a file not yet in the zoo's cache is exported first, which needs the
  zoo extra), with their own geometric mean. A model that cannot be re-batched (a layer
  without a batching rule) streams with ``max_batch=1``, and says so.
- pipeline: squeezenet, then a function stage feeding densenet121 the request's original
  image, then densenet121: ``flowrt.Pipeline`` against running the two models one after the
  other per request, on the same loaded models.
- priority: a LOW stream of ``--low-model`` keeps every CPU worker busy while HIGH requests
  of ``--high-model`` arrive one at a time (after a pseudo-random pause); their latency is
  compared with the same requests on the idle runtime, the two alternating round by round.

The engines alternate round by round (``--rounds``) so that both see the same machine; ONNX
Runtime's idle threads are told not to spin, as in ``compare_ort.py``.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs
import numpy as np
import onnxruntime as ort
import trio

import flowrt
from flowrt.bench import BenchResult, ort_session, through_stream
from flowrt.models import LIGHT_MODELS, light_model, pattern_input
from flowrt.workers.cpu.workers import default_cpu_workers

sys.path.insert(0, str(Path(__file__).resolve().parent))  # zoo.py and zoo_models.py, beside this file

Feeds = Mapping[str, np.ndarray]


@attrs.frozen
class StreamSettings:
    """How the streaming case runs flowrt: pools loaded per model and the stream's options."""

    pools: int
    max_in_flight: int
    max_batch: int = 1
    max_delay: float = 0.0

    def describe(self) -> str:
        batching = f", max_batch={self.max_batch}, max_delay={self.max_delay * 1e3:g} ms"
        return (
            f"rt.load(max_in_flight={self.pools}), model.stream(max_in_flight={self.max_in_flight}"
            f"{batching if self.max_batch > 1 else ''})"
        )


# The best of those tried on a 2-core machine, alternated in one process: pools 1-3,
# max_in_flight 4-16, max_batch 1-8, max_delay 0-10 ms. Batches of 4 (two running at once, a
# core each) beat two requests of batch 1 by 5-20% on the small models (a run's fixed costs
# and each layer's dispatch are paid once per batch) and by 25-40% on bvlc_alexnet and
# zfnet512 (their fully connected weights are read once per batch), and tie on densenet121
# and resnet50; batches of 8 (max_in_flight=32) gain another 10-20% on bvlc_alexnet, zfnet512
# and vgg19 but lose on squeezenet, shufflenet and densenet121, whose activations then leave
# the cache (geometric mean 1.13 against 1.16 for batches of 4, in one session). 2 ms is
# about a small model's run: enough for a batch to fill.
BEST = StreamSettings(pools=2, max_in_flight=16, max_batch=4, max_delay=0.002)


def _split(requests: int, rounds: int) -> list[int]:
    return [requests // rounds + (1 if r < requests % rounds else 0) for r in range(rounds)]


def _merge(engine: str, rounds: Sequence[tuple[list[float], float]]) -> BenchResult:
    latencies = [x for lat, _ in rounds for x in lat]
    return BenchResult(engine, tuple(latencies), sum(wall for _, wall in rounds), 0.0)


async def _through_stream(stream: Any, feeds: Feeds, requests: int) -> tuple[list[float], float]:
    """``requests`` sent into an open stream as fast as it takes them (``flowrt.bench``)."""
    return await through_stream(stream, feeds, requests)


async def _one_by_one(run: Callable[[], Awaitable[Any]], requests: int) -> tuple[list[float], float]:
    latencies = []
    start = time.perf_counter()
    for _ in range(requests):
        begin = time.perf_counter()
        await run()
        latencies.append(time.perf_counter() - begin)
    return latencies, time.perf_counter() - start


def _ort_loop(session: ort.InferenceSession, feeds: Feeds, requests: int) -> tuple[list[float], float]:
    latencies = []
    start = time.perf_counter()
    for _ in range(requests):
        begin = time.perf_counter()
        session.run(None, feeds)
        latencies.append(time.perf_counter() - begin)
    return latencies, time.perf_counter() - start


def _row(label: str, r: BenchResult) -> str:
    return f"{label:<26} {r.throughput:>9.1f} {r.percentile_ms(50):>9.1f} {r.percentile_ms(99):>9.1f}"


HEADER = f"{'':<26} {'req/s':>9} {'p50 ms':>9} {'p99 ms':>9}"


# -- streaming ------------------------------------------------------------------------------
async def _streaming(
    path: str, feeds: Feeds | None, backends: list[str], settings: StreamSettings, requests: int, rounds: int
):
    """flowrt's stream against ONNX Runtime's loop on the model at ``path``, with ``feeds``
    (None: the light models' pattern inputs)."""
    opt = flowrt.optimize(flowrt.onnx.load(path), backends=backends)
    async with flowrt.Runtime() as rt:
        model = await rt.load(opt, max_in_flight=settings.pools)
        if feeds is None:
            feeds = {n: pattern_input(info) for n, info in model.inputs.items()}
        session = ort_session(path, rt.cpu_workers)

        try:
            model.stream(max_in_flight=1, max_batch=settings.max_batch)
        except flowrt.errors.ShapeError as e:  # a model that cannot be re-batched streams unbatched
            print(f"  ({Path(path).stem}: no batches: {e})", flush=True)
            settings = attrs.evolve(settings, max_batch=1, max_delay=0.0)

        def open_stream() -> Any:
            return model.stream(
                max_in_flight=settings.max_in_flight,
                max_batch=settings.max_batch,
                max_delay=settings.max_delay,
            )

        async with open_stream() as s:  # warm-up; loads the batch sizes a batching stream uses
            await _through_stream(s, feeds, settings.max_in_flight)
        _ort_loop(session, feeds, 2)
        ours, theirs = [], []
        for count in _split(requests, rounds):
            async with open_stream() as s:
                ours.append(await _through_stream(s, feeds, count))
            theirs.append(_ort_loop(session, feeds, count))
    return _merge("flowrt", ours), _merge("onnxruntime", theirs)


def _zoo_models(names: list[str], exporter: str) -> dict[str, tuple[str, Feeds]]:
    """Each zoo model's file (exported first when the zoo's cache lacks it) and seeded feeds."""
    from zoo import DEFAULT_CACHE, cached_path, export_zoo
    from zoo_models import ZOO, make_feeds

    unknown = [n for n in names if n not in ZOO]
    if unknown:
        raise SystemExit(f"--zoo: unknown model(s) {', '.join(unknown)}; the zoo has {', '.join(ZOO)}")
    failed = export_zoo(names, [exporter], DEFAULT_CACHE)
    if failed:
        raise SystemExit(f"--zoo: export failed: {failed}")
    return {n: (str(cached_path(DEFAULT_CACHE, n, exporter)), make_feeds(ZOO[n].inputs)) for n in names}


def _stream_table(
    title: str, models: Mapping[str, tuple[str, Feeds | None]], args: argparse.Namespace, backends: list[str]
) -> dict[str, float]:
    """One streaming table over ``models`` (name -> path, feeds); flowrt/ORT requests/s each."""
    settings = StreamSettings(args.pools, args.max_in_flight, args.max_batch, args.max_delay)
    print(f"\n== streaming: {args.requests} requests of batch 1 per model, {title}")
    print(f"flowrt: {settings.describe()}; ONNX Runtime: run() in a loop, {default_cpu_workers()} threads")
    print(f"{'model':<18} {'flowrt req/s':>12} {'p50 ms':>8} {'p99 ms':>8}   {'ORT req/s':>9} {'p50 ms':>8} "
          f"{'p99 ms':>8}   {'ratio':>6}")  # fmt: skip
    ratios = {}
    for name, (path, feeds) in models.items():
        ours, theirs = trio.run(_streaming, path, feeds, backends, settings, args.requests, args.rounds)
        ratios[name] = ours.throughput / theirs.throughput
        print(
            f"{name:<18} {ours.throughput:>12.1f} {ours.percentile_ms(50):>8.1f} {ours.percentile_ms(99):>8.1f}"
            f"   {theirs.throughput:>9.1f} {theirs.percentile_ms(50):>8.1f} {theirs.percentile_ms(99):>8.1f}"
            f"   {ratios[name]:>6.2f}",
            flush=True,
        )
    geomean = math.exp(sum(math.log(r) for r in ratios.values()) / len(ratios))
    print(f"geometric mean of flowrt/ORT requests/s, {title}: {geomean:.2f} (target >= 1.2)")
    return ratios


def run_streaming(args: argparse.Namespace, backends: list[str]) -> None:
    if args.models:
        light = {name: (str(light_model(name)), None) for name in args.models}
        ratios = _stream_table("light models", light, args, backends)
        named = [f"{m} {ratios[m]:.2f}" for m in ("shufflenet", "bvlc_alexnet", "densenet121") if m in ratios]
        if named:
            print(f"  {', '.join(named)} (target >= 1.3 each)")
    if args.zoo:
        zoo = _zoo_models(args.zoo, args.zoo_exporter)
        _stream_table(f"zoo models ({args.zoo_exporter} exports)", zoo, args, backends)


# -- pipeline -------------------------------------------------------------------------------
async def _pipeline(backends: list[str], requests: int, rounds: int, max_in_flight: int | None):
    first, second = (
        flowrt.optimize(flowrt.onnx.load(str(light_model(m))), backends=backends)
        for m in ("squeezenet", "densenet121")
    )
    async with flowrt.Runtime() as rt:
        classify, describe = await rt.load(first), await rt.load(second)
        feeds = {n: pattern_input(info) for n, info in classify.inputs.items()}
        (image_name,) = feeds
        (target_name,) = describe.inputs

        def original_image(outputs: Feeds, request_feeds: Feeds) -> dict[str, np.ndarray]:
            return {target_name: request_feeds[image_name]}

        async def one_after_the_other() -> None:
            outputs = await classify.run(feeds)
            await describe.run(original_image(outputs, feeds))

        pipeline = flowrt.Pipeline([classify, original_image, describe])
        await one_after_the_other()
        async with pipeline.stream(max_in_flight=max_in_flight) as s:
            await _through_stream(s, feeds, 2)
        overlapped, serial = [], []
        for count in _split(requests, rounds):
            async with pipeline.stream(max_in_flight=max_in_flight) as s:
                overlapped.append(await _through_stream(s, feeds, count))
            serial.append(await _one_by_one(one_after_the_other, count))
        return _merge("pipeline", overlapped), _merge("serial", serial), s.max_in_flight


def run_pipeline(args: argparse.Namespace, backends: list[str]) -> None:
    print(f"\n== pipeline: squeezenet -> original image -> densenet121, {args.pipeline_requests} requests")
    overlapped, serial, in_flight = trio.run(
        _pipeline, backends, args.pipeline_requests, args.rounds, args.pipeline_in_flight
    )
    print(HEADER)
    print(_row(f"Pipeline (max_in_flight={in_flight})", overlapped))
    print(_row("one model after the other", serial))
    print(
        f"ratio Pipeline / one after the other, req/s: {overlapped.throughput / serial.throughput:.2f} (target >= 1.25)"
    )


# -- priority -------------------------------------------------------------------------------
async def _priority(args: argparse.Namespace, backends: list[str]):
    low_opt, high_opt = (
        flowrt.optimize(flowrt.onnx.load(str(light_model(m))), backends=backends)
        for m in (args.low_model, args.high_model)
    )
    pauses = np.random.default_rng(0).uniform(0.0, args.max_pause, args.priority_requests)
    async with flowrt.Runtime() as rt:
        low, high = await rt.load(low_opt), await rt.load(high_opt)
        low_feeds = {n: pattern_input(info) for n, info in low.inputs.items()}
        high_feeds = {n: pattern_input(info) for n, info in high.inputs.items()}

        async def high_requests(part: np.ndarray) -> tuple[list[float], float]:
            latencies = []
            start = time.perf_counter()
            for pause in part:
                await trio.sleep(pause)
                begin = time.perf_counter()
                await high.run(high_feeds, priority=flowrt.Priority.HIGH)
                latencies.append(time.perf_counter() - begin)
            return latencies, time.perf_counter() - start

        async def beside_low(part: np.ndarray) -> tuple[tuple[list[float], float], float]:
            """HIGH requests while a LOW stream keeps every worker busy; and LOW's requests/s."""
            low_done = 0
            async with low.stream(max_in_flight=2 * rt.cpu_workers, priority=flowrt.Priority.LOW) as s:

                async def saturate() -> None:
                    while True:
                        await s.send(low_feeds)

                async def drain() -> None:
                    nonlocal low_done
                    async for _ in s:
                        low_done += 1

                async with trio.open_nursery() as nursery:
                    nursery.start_soon(saturate)
                    await s.__anext__()  # the workers are busy with LOW work from here on
                    start = time.perf_counter()
                    nursery.start_soon(drain)
                    loaded = await high_requests(part)
                    nursery.cancel_scope.cancel()
            return loaded, low_done / (time.perf_counter() - start)

        await high.run(high_feeds)
        await low.run(low_feeds)
        idle, loaded, low_rates = [], [], []
        for part in np.array_split(pauses, args.rounds):  # alternated, so both see the same machine
            idle.append(await high_requests(part))
            beside, rate = await beside_low(part)
            loaded.append(beside)
            low_rates.append(rate)
    return _merge("idle", idle), _merge("loaded", loaded), float(np.mean(low_rates))


def run_priority(args: argparse.Namespace, backends: list[str]) -> None:
    print(
        f"\n== priority: {args.priority_requests} HIGH {args.high_model} requests, each after a pause of "
        f"0-{args.max_pause * 1e3:g} ms, alone and beside a LOW {args.low_model} stream"
    )
    idle, loaded, low_rate = trio.run(_priority, args, backends)
    print(HEADER)
    print(_row("HIGH, idle runtime", idle))
    print(_row(f"HIGH, beside LOW ({low_rate:.1f}/s)", loaded))
    print(
        f"ratio HIGH p99 beside LOW / idle p99: {loaded.percentile_ms(99) / idle.percentile_ms(99):.2f}, "
        f"/ idle p50: {loaded.percentile_ms(99) / idle.percentile_ms(50):.2f} (target <= 2)"
    )


CASES: dict[str, Callable[[argparse.Namespace, list[str]], None]] = {
    "streaming": run_streaming,
    "pipeline": run_pipeline,
    "priority": run_priority,
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", default=",".join(CASES), help="comma-separated, of: " + ", ".join(CASES))
    parser.add_argument("--models", nargs="*", default=list(LIGHT_MODELS), help="streaming: light models")
    parser.add_argument("--zoo", nargs="*", default=[], help="streaming: zoo models too (benchmarks/zoo.py)")
    parser.add_argument("--zoo-exporter", choices=("torchscript", "dynamo"), default="dynamo")
    parser.add_argument("--requests", type=int, default=128, help="streaming: requests per model")
    parser.add_argument("--quick", action="store_true", help="16 requests per case and model")
    parser.add_argument("--backends", default="CpuAcc,CpuRef")
    parser.add_argument("--rounds", type=int, default=2, help="alternations of the engines compared")
    parser.add_argument("--pools", type=int, default=BEST.pools, help="streaming: pools loaded")
    parser.add_argument("--max-in-flight", type=int, default=BEST.max_in_flight)
    parser.add_argument("--max-batch", type=int, default=BEST.max_batch)
    parser.add_argument("--max-delay", type=float, default=BEST.max_delay, help="seconds")
    parser.add_argument("--pipeline-requests", type=int, default=64)
    parser.add_argument("--pipeline-in-flight", type=int, default=None)
    parser.add_argument("--priority-requests", type=int, default=48)
    parser.add_argument("--low-model", default="densenet121")
    parser.add_argument("--high-model", default="squeezenet")
    parser.add_argument("--max-pause", type=float, default=0.05, help="priority: seconds")
    args = parser.parse_args()
    if args.quick:
        args.requests = args.pipeline_requests = args.priority_requests = 16
    backends = args.backends.split(",")
    ort.set_default_logger_severity(3)
    print(f"backends {','.join(backends)}, {default_cpu_workers()} cores")
    for case in args.cases.split(","):
        CASES[case](args, backends)


if __name__ == "__main__":
    np.seterr(all="ignore")
    main()
