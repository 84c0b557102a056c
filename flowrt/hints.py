"""Performance hints: a stream's settings chosen from the model's measured cost and the
machine, as OpenVINO's ``LATENCY`` and ``THROUGHPUT`` hints choose streams and batch.

``model.stream(hint="throughput")`` (a stream's default) and ``hint="latency"``; explicit
``max_in_flight``, ``max_batch`` and ``max_delay`` still win over what a hint chooses.

- **latency**: every request runs as soon as it is sent, unbatched, one per memory pool
  (``max_in_flight`` = pools, ``max_batch`` 1): nothing waits for a batch to form.
- **throughput**: the model's cost per request is measured with every pool busy (one
  ``run`` per pool at once, as a busy stream runs them: a core each), at batch 1, then 2, 4
  and 8 while larger batches keep paying (at least ``GAIN`` cheaper per request than the
  batch before), a batch run stays within half the latency budget, and the measurement within
  ``MEASURE_BUDGET_S``. The batch chosen is the cheapest per request; ``max_delay`` is a
  quarter of a lone run (long enough for a batch to fill from a busy client, short against a
  request's latency) and ``max_in_flight`` two batches per pool (one running, one forming).
  The latency budget (``latency_budget`` seconds; default ``BUDGET_RUNS`` lone runs) bounds
  what a request may wait: a saturated stream holds each request about two batch runs.

The measurement takes place when ``rt.load(opt, hint="throughput")`` loads the model, or when
the first stream with the hint opens, and is kept in a file of the cache directory
(``FLOWRT_CACHE_DIR``, else ``~/.cache/flowrt``, under ``hints/``), keyed by the network's
layers and shapes, its backends, the pools, the machine's cores and flowrt's sources: a
second process does not measure again, a newer flowrt does. Batch sizes measured and not
chosen are unloaded again.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import platform
import time
from typing import TYPE_CHECKING, Any

import attrs
import trio

from flowrt import source_stamps
from flowrt.defaults import cache_root
from flowrt.errors import FlowrtError
from flowrt.validate import check_choice

if TYPE_CHECKING:
    from flowrt.loaded_network import LoadedNetwork

logger = logging.getLogger(__name__)

HINTS = ("latency", "throughput")
BATCHES = (1, 2, 4, 8)
GAIN = 0.1  # a larger batch is measured further only when it was this much cheaper per request
MEASURE_BUDGET_S = 2.0  # the whole measurement, loads of batch sizes aside
MIN_TIMED_S = 0.15  # each batch size's timed rounds last at least this long (and two rounds)
BUDGET_RUNS = 8  # the default latency budget, in lone runs
DELAY_RUNS = 0.25  # max_delay, in lone runs
FORMAT = 1  # the cache file's layout


def check_hint(hint: Any, where: str) -> str | None:
    """``hint`` as one of :data:`HINTS` (in any case) or None; ArgumentError otherwise."""
    return None if hint is None else check_choice("hint", hint, HINTS, where=where)


@attrs.frozen
class Costs:
    """What the throughput hint measured: a lone run's latency, and per batch size the
    seconds per request with every pool busy."""

    lone_s: float
    per_request_s: dict[int, float]


@attrs.frozen
class StreamChoice:
    """A stream's settings as a hint chose them, and why (``reason``, one line)."""

    hint: str
    max_in_flight: int
    max_batch: int
    max_delay: float
    reason: str
    costs: Costs | None = None


def latency_choice(pools: int) -> StreamChoice:
    return StreamChoice("latency", pools, 1, 0.0, f"latency: unbatched, one request per pool ({pools})")


def throughput_choice(costs: Costs, pools: int, latency_budget: float | None) -> StreamChoice:
    """The cheapest batch per request whose run stays within half the latency budget."""
    budget = BUDGET_RUNS * costs.lone_s if latency_budget is None else latency_budget
    fits = {
        b: c for b, c in costs.per_request_s.items() if b == 1 or b * pools * c <= budget / 2
    }  # a batch run, a core each: b * pools * c seconds
    batch = min(fits, key=lambda b: (fits[b], b))
    delay = min(DELAY_RUNS * costs.lone_s, budget / 4) if batch > 1 else 0.0
    measured = ", ".join(f"batch {b} {c * 1e3:.2f} ms" for b, c in sorted(costs.per_request_s.items()))
    reason = (
        f"throughput: per request with {pools} pool(s) busy: {measured}; lone run "
        f"{costs.lone_s * 1e3:.2f} ms, latency budget {budget * 1e3:.1f} ms -> batch {batch}"
    )
    return StreamChoice("throughput", 2 * pools * batch, batch, delay, reason, costs)


def cache_key(model: LoadedNetwork) -> str:
    """What the costs depend on: layers, shapes and backends, pools, cores and the machine, and
    flowrt's sources (kernels that change change the costs)."""
    graph = model.unbatched.graph
    layers = [
        (layer.name, layer.kind, layer.backend, [str(o.info) for o in layer.outputs])
        for layer in graph.topological_order()
    ]
    machine = (os.cpu_count(), platform.machine(), platform.processor())
    parts = [FORMAT, layers, model.pools.count, *machine, source_stamps.flowrt_digest()]
    return hashlib.sha1(json.dumps(parts, default=str).encode()).hexdigest()


def _cache_file(key: str):
    return cache_root() / "hints" / f"{key}.json"


def load_cached(key: str) -> Costs | None:
    try:
        data = json.loads(_cache_file(key).read_text())
        return Costs(float(data["lone_s"]), {int(b): float(c) for b, c in data["per_request_s"].items()})
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


def store(key: str, costs: Costs) -> None:
    path = _cache_file(key)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps({"lone_s": costs.lone_s, "per_request_s": costs.per_request_s}))
        os.replace(tmp, path)
    except OSError as e:  # a read-only cache: measured again next time
        logger.info("hints: cannot keep the measurement in %s: %s", path, e)


async def _timed_rounds(model: LoadedNetwork, feeds: dict[str, Any], pools: int) -> float:
    """Seconds per run with ``pools`` runs at once, over at least two rounds and MIN_TIMED_S."""

    async def round_() -> None:
        async with trio.open_nursery() as nursery:
            for _ in range(pools):
                nursery.start_soon(model.run, feeds)

    await round_()  # warm: first runs prepare and bind the pools
    rounds, start = 0, time.perf_counter()
    while rounds < 2 or time.perf_counter() - start < MIN_TIMED_S:
        await round_()
        rounds += 1
    return (time.perf_counter() - start) / (rounds * pools)


async def measure(model: LoadedNetwork, latency_budget: float | None = None) -> Costs:
    """Measure the costs the throughput hint chooses from (see the module docstring)."""
    from flowrt.models import pattern_input
    from flowrt.stream import request_rows

    pools = model.pools.count
    feeds = {name: pattern_input(info) for name, info in model.inputs.items()}
    await model.run(feeds)
    lone = []
    for _ in range(3):
        start = time.perf_counter()
        await model.run(feeds)
        lone.append(time.perf_counter() - start)
    lone_s = sorted(lone)[1]
    budget = BUDGET_RUNS * lone_s if latency_budget is None else latency_budget
    per_request = {1: await _timed_rounds(model, feeds, pools)}
    began = time.perf_counter()
    for batch in BATCHES[1:]:
        last, before = per_request[batch // 2], per_request.get(batch // 4)
        if (before is not None and last > (1 - GAIN) * before) or batch * pools * last > budget / 2:
            break  # the last doubling did not pay, or this batch's run would not fit the budget
        if time.perf_counter() - began > MEASURE_BUDGET_S:
            break
        try:
            variant = await model.batched(batch * request_rows(model.inputs))
        except FlowrtError as e:  # ShapeError: a layer without a batching rule
            logger.info("hints: %s cannot run batches (%s); measured unbatched", model.network_id, e)
            break
        batch_feeds = {name: pattern_input(info) for name, info in variant.inputs.items()}
        per_request[batch] = await _timed_rounds(variant, batch_feeds, pools) / batch
    return Costs(lone_s, per_request)


async def choose(model: LoadedNetwork, hint: str, latency_budget: float | None = None) -> StreamChoice:
    """The stream settings ``hint`` chooses for ``model`` (measured, or read from the cache)."""
    pools = model.pools.count
    if hint == "latency":
        return latency_choice(pools)
    costs = model.measured_costs
    if costs is None:
        key = cache_key(model)
        costs = load_cached(key)
        if costs is None:
            costs = await measure(model, latency_budget)
            store(key, costs)
        model.measured_costs = costs
    choice = throughput_choice(costs, pools, latency_budget)
    # Batch sizes measured and not used by this choice are let go.
    await model.drop_batched(larger_than=choice.max_batch * model.request_rows_or_1())
    logger.info("hints: %s: %s", model.network_id, choice.reason)
    return choice
