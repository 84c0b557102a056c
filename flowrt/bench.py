"""``flowrt bench``: latency percentiles, throughput and load time, optionally against ONNX Runtime.

The ONNX Runtime comparison runs in the same process, alternating with flowrt round by round,
so both see the same machine state.

With ``batch`` N, each request is one run of N samples: flowrt loads the model re-batched
(``flowrt.set_batch``), and ONNX Runtime is given the same batch-N feeds. ONNX Runtime refuses
them for a model exported with a batch of 1 (its declared input shape, and Reshape targets that
hard-code the 1); it then runs each request as N runs of batch 1 in a loop, as one of its users
would with such a model, and the result carries a note saying so with ONNX Runtime's error.
"""

from __future__ import annotations

import functools
import sys
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import attrs
import numpy as np
import trio
from tqdm import tqdm

import flowrt
from flowrt.errors import InputError
from flowrt.models import pattern_input
from flowrt.validate import check_seconds


@attrs.frozen
class BenchResult:
    """One engine's figures: per-request latencies (seconds), wall time, load time."""

    engine: str
    latencies: tuple[float, ...]
    wall_s: float
    load_s: float
    batch: int = 1
    note: str = ""

    def percentile_ms(self, q: float) -> float:
        return float(np.percentile(self.latencies, q)) * 1e3

    @property
    def throughput(self) -> float:
        """Requests per second over the measured wall time."""
        return len(self.latencies) / self.wall_s if self.wall_s > 0 else float("nan")

    def summary(self) -> dict[str, float]:
        return {
            "requests": len(self.latencies),
            "p50_ms": self.percentile_ms(50),
            "p90_ms": self.percentile_ms(90),
            "p99_ms": self.percentile_ms(99),
            "throughput_rps": self.throughput,
            "samples_per_s": self.throughput * self.batch,
            "load_ms": self.load_s * 1e3,
            "batch": self.batch,
        }


async def _flowrt_round(
    model, feeds, requests: int, concurrency: int, tick: Callable[[], None], until: float | None = None
):
    """``requests`` runs by ``concurrency`` clients; with ``until`` (a perf_counter time), as many
    as start before it instead."""
    latencies: list[float] = []
    remaining = [requests]

    async def client() -> None:
        while remaining[0] > 0 if until is None else time.perf_counter() < until:
            remaining[0] -= 1
            start = time.perf_counter()
            await model.run(feeds)
            latencies.append(time.perf_counter() - start)
            tick()

    start = time.perf_counter()
    async with trio.open_nursery() as nursery:
        for _ in range(concurrency):
            nursery.start_soon(client)
    return latencies, time.perf_counter() - start


async def through_stream(
    stream, feeds, requests: int, tick: Callable[[], None] | None = None, until: float | None = None
) -> tuple[list[float], float]:
    """Send ``requests`` requests (with ``until``, a perf_counter time: as many as are sent
    before it) into an open stream as fast as it takes them, and receive them all; each
    request's latency, from its acceptance to its result, and the wall time."""
    latencies: list[float] = []
    accepted: list[float] = []

    async def produce() -> None:
        sent = 0
        while sent < requests if until is None else time.perf_counter() < until:
            await stream.send(feeds)
            accepted.append(time.perf_counter())
            sent += 1
        stream.close()

    start = time.perf_counter()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(produce)
        async for _ in stream:
            latencies.append(time.perf_counter() - accepted[len(latencies)])
            if tick is not None:
                tick()
    return latencies, time.perf_counter() - start


async def _stream_round(model, feeds, requests: int, tick: Callable[[], None], until: float | None = None):
    """:func:`through_stream` on ``model.stream()`` (its hint's settings); also the choice."""
    async with model.stream() as stream:
        latencies, wall = await through_stream(stream, feeds, requests, tick, until)
        return latencies, wall, stream.choice


def _ort_request(session, feeds: dict[str, np.ndarray], batch: int) -> tuple[Callable[[], None], str]:
    """How ONNX Runtime runs one request, and a note when that is not one run of the feeds:
    the batch-N feeds in one run when it takes them, else N runs of batch 1."""

    def whole() -> None:
        session.run(None, feeds)

    if batch == 1:
        return whole, ""
    try:
        whole()
        return whole, ""
    except Exception as e:  # ONNX Runtime's own error types; its message is the note
        reason = (str(e).strip().splitlines() or [type(e).__name__])[0]
    samples = [{name: array[i : i + 1] for name, array in feeds.items()} for i in range(batch)]

    def loop() -> None:
        for sample in samples:
            session.run(None, sample)

    return (
        loop,
        f"onnxruntime refused batch {batch} ({reason}); each of its requests is {batch} runs of batch 1",
    )


def _ort_round(
    run_request: Callable[[], None],
    requests: int,
    concurrency: int,
    tick: Callable[[], None],
    stop: threading.Event,
):
    """``requests`` ONNX Runtime requests by ``concurrency`` threads; those not begun when
    ``stop`` is set are skipped (Ctrl-C: the process must not wait for the whole round)."""

    def one(_: int) -> float | None:
        if stop.is_set():
            return None
        start = time.perf_counter()
        run_request()
        tick()
        return time.perf_counter() - start

    start = time.perf_counter()
    with ThreadPoolExecutor(max_workers=concurrency) as pool:
        latencies = [t for t in pool.map(one, range(requests)) if t is not None]
    return latencies, time.perf_counter() - start


async def _in_thread(round_fn: Callable[..., Any], *args: Any) -> Any:
    """Run an ONNX Runtime round in a thread; on cancellation (Ctrl-C) tell it to stop and
    return at once instead of waiting for every request of the round."""
    stop = threading.Event()
    try:
        return await trio.to_thread.run_sync(functools.partial(round_fn, *args, stop), abandon_on_cancel=True)
    finally:
        stop.set()


def ort_session(model_path: str, threads: int) -> Any:
    """ONNX Runtime on the CPU with ``threads`` intra-op threads that do not spin when idle:
    spinning, they would hold the cores through flowrt's turns in an alternating comparison."""
    import onnxruntime as ort  # a comparison peer only, imported on demand

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return ort.InferenceSession(model_path, options, providers=["CPUExecutionProvider"])


def run_bench(
    model_path: str,
    backends: Sequence[str],
    *,
    iterations: int,
    concurrency: int = 1,
    vs_onnxruntime: bool = False,
    rounds: int = 2,
    progress: bool = True,
    duration: float | None = None,
    batch: int = 1,
    optimized: flowrt.OptimizedNetwork | None = None,
    cpu_workers: int | None = None,
    hint: str | None = None,
) -> list[BenchResult]:
    """Benchmark flowrt (and ONNX Runtime when asked) on one model; returns one result each.

    The ONNX model at ``model_path`` is optimized for ``backends``, unless the caller gives it
    ``optimized`` (a .flowrt file's network, say: ``backends`` is then not used, and flowrt's
    load time counts the load only). ``cpu_workers``: the Runtime's (None: its default);
    ONNX Runtime gets as many intra-op threads. ``progress`` draws a bar over the requests
    on stderr. With ``duration`` (seconds), flowrt runs for that long in all (``iterations``
    is ignored) and ONNX Runtime runs as many requests as flowrt did in each round
    (ArgumentError unless it is a positive finite number: an infinite one would never end).
    With ``batch`` N > 1 a request is N samples: the model is re-batched (ShapeError when it
    cannot be), and ONNX Runtime runs N batch-1 runs per request when it refuses the batch
    (see the module docstring). With ``hint`` ("latency" or "throughput"), flowrt's requests go
    through ``model.stream()`` of a model loaded with that hint, as fast as it takes them
    (``concurrency`` is then ONNX Runtime's alone); flowrt's result notes what the hint chose.
    """
    if duration is not None:
        duration = check_seconds("duration", duration, where="run_bench")
    per_round = [iterations // rounds + (1 if r < iterations % rounds else 0) for r in range(rounds)]
    engines = 2 if vs_onnxruntime else 1
    bar = tqdm(
        total=None if duration else iterations * engines,
        desc="benchmarking",
        unit="req",
        disable=not progress,
        leave=False,
        file=sys.stderr,
    )

    async def main() -> list[BenchResult]:
        start = time.perf_counter()
        async with flowrt.Runtime(cpu_workers=cpu_workers) as rt:
            opt = optimized
            if opt is None:
                opt = flowrt.optimize(flowrt.onnx.load(model_path), backends=backends, registry=rt.registry)
            pools = None if hint is not None else concurrency
            model = await rt.load(opt, max_in_flight=pools, batch=None if batch == 1 else batch, hint=hint)
            flowrt_load = time.perf_counter() - start
            feeds = {n: pattern_input(info) for n, info in model.inputs.items()}
            await model.run(feeds)  # warm-up
            session, ort_load, ort_request, note = None, 0.0, None, ""
            if vs_onnxruntime:
                import onnxruntime as ort  # a comparison peer only, imported on demand

                ort.set_default_logger_severity(3)
                start = time.perf_counter()
                session = ort_session(model_path, rt.cpu_workers)
                ort_load = time.perf_counter() - start
                ort_request, note = _ort_request(session, feeds, batch)
                ort_request()  # warm-up
            ours, theirs, our_wall, their_wall, chose = [], [], 0.0, 0.0, ""
            for count in per_round:
                until = None if duration is None else time.perf_counter() + duration / rounds
                if hint is None:
                    lat, wall = await _flowrt_round(
                        model, feeds, count, concurrency, lambda: bar.update(), until
                    )
                else:
                    lat, wall, choice = await _stream_round(model, feeds, count, lambda: bar.update(), until)
                    chose = f"hint {choice.reason}"
                count = len(lat)
                ours += lat
                our_wall += wall
                if ort_request is not None:
                    lat, wall = await _in_thread(
                        _ort_round, ort_request, count, concurrency, lambda: bar.update()
                    )
                    theirs += lat
                    their_wall += wall
        results = [BenchResult("flowrt", tuple(ours), our_wall, flowrt_load, batch, chose)]
        if session is not None:
            results.append(BenchResult("onnxruntime", tuple(theirs), their_wall, ort_load, batch, note))
        return results

    try:
        return trio.run(main)
    finally:
        bar.close()


def format_results(results: Sequence[BenchResult]) -> str:
    """A table of the results and, with a peer, the flowrt/peer ratios (lower latency is better)."""
    lines = [f"{'engine':<12} {'p50 ms':>9} {'p90 ms':>9} {'p99 ms':>9} {'req/s':>9} {'load ms':>9}"]
    for r in results:
        s = r.summary()
        lines.append(
            f"{r.engine:<12} {s['p50_ms']:>9.2f} {s['p90_ms']:>9.2f} {s['p99_ms']:>9.2f} "
            f"{s['throughput_rps']:>9.1f} {s['load_ms']:>9.1f}"
        )
    if len(results) == 2:
        ours, theirs = results[0].summary(), results[1].summary()
        lines.append(
            f"{'ratio':<12} {ours['p50_ms'] / theirs['p50_ms']:>9.2f} {ours['p90_ms'] / theirs['p90_ms']:>9.2f} "
            f"{ours['p99_ms'] / theirs['p99_ms']:>9.2f} {ours['throughput_rps'] / theirs['throughput_rps']:>9.2f}"
            "   (flowrt / onnxruntime; latency: lower is better, req/s: higher is better)"
        )
    if results and results[0].batch > 1:
        lines.append(
            f"each request is a batch of {results[0].batch} samples: samples/s = req/s x {results[0].batch}"
        )
    lines += [f"note: {r.note}" for r in results if r.note]
    return "\n".join(lines)


def plot_latencies(results: Sequence[BenchResult], path: str) -> None:
    """Draw each engine's latency distribution (a histogram, with p50 and p99 marked) to ``path``.

    Needs matplotlib (``pip install 'flowrt[plot]'``); raises InputError naming it otherwise.
    """
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.container import BarContainer
    except ImportError as e:
        raise InputError(f"--plot needs matplotlib (pip install 'flowrt[plot]'): {e}") from None
    figure, axes = plt.subplots(figsize=(8, 4.5))
    for r in results:
        ms = np.asarray(r.latencies) * 1e3
        bars = axes.hist(ms, bins=40, alpha=0.55, label=f"{r.engine} (p50 {r.percentile_ms(50):.2f} ms)")[2]
        assert isinstance(bars, BarContainer)  # one data set, histtype "bar"
        color = bars[0].get_facecolor()
        for q, style in ((50, "-"), (99, ":")):
            axes.axvline(r.percentile_ms(q), color=color, linestyle=style, alpha=0.9)
    axes.set_xlabel("latency (ms); solid: p50, dotted: p99")
    axes.set_ylabel("requests")
    axes.legend()
    figure.tight_layout()
    figure.savefig(path)
    plt.close(figure)
