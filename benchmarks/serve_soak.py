"""A bounded load on ``flowrt serve`` with bad requests among the good: does the server's
memory stay flat, and is every pool free afterwards?

    python benchmarks/serve_soak.py [--model squeezenet] [--seconds 60] [--clients 16] [--bad 0.1]

``flowrt serve`` runs as its own process on a repository holding the light model with
dynamic batching on (``benchmarks/serve.py``'s ``BATCHING_ON``). ``--clients`` threads of
Triton's HTTP client send requests for ``--seconds`` seconds; each request is bad with
probability ``--bad`` (its input declared FP64 where the model takes FP32: the server must
answer 400 and go on), else good (it must succeed). The server's resident memory (VmRSS) is
sampled every ``SAMPLE_S`` seconds. At the end the server's ``/metrics`` say how many of the
model's memory pools are free and how many requests wait.

Prints the requests (good, bad answered 400, anything else), the RSS at 10%, 50% and 100% of
the time and its growth from the 10% mark to the end (the first seconds load kernels and
allocate the batch-size variants), and the pools, free and all.
"""

from __future__ import annotations

import argparse
import random
import re
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

import numpy as np
import tritonclient.http as httpclient
from serve import BATCHING_ON, Served, _feeds, _free_port, _infer_inputs, _repository
from tritonclient.utils import InferenceServerException

from flowrt.models import light_model

SAMPLE_S = 0.5


def _rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def _gauge(metrics: str, name: str, model: str) -> float:
    found = re.search(rf'^{name}{{model="{model}"}} (\S+)$', metrics, re.MULTILINE)
    return float(found.group(1)) if found else float("nan")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="squeezenet")
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--bad", type=float, default=0.1, help="share of bad requests")
    args = parser.parse_args()
    path = str(light_model(args.model))
    feeds = _feeds(path)
    wrong = {name: value.astype(np.float64) for name, value in feeds.items()}
    counts = {"good": 0, "bad (400)": 0, "other": 0}
    others: list[str] = []
    lock = threading.Lock()
    samples: list[tuple[float, float]] = []
    with tempfile.TemporaryDirectory() as tmp:
        repository = _repository(Path(tmp) / "repo", args.model, path, BATCHING_ON)
        port = _free_port()
        command = [sys.executable, "-m", "flowrt", "serve", str(repository), "--http-port", str(port)]
        served = Served("flowrt", command, port, Path(tmp) / "serve.log")
        start = time.perf_counter()
        end = start + args.seconds

        def client(seed: int) -> None:
            rng = random.Random(seed)
            with httpclient.InferenceServerClient(served.url, network_timeout=600) as connection:
                good, bad = _infer_inputs(feeds), _infer_inputs(wrong)
                while time.perf_counter() < end:
                    is_bad = rng.random() < args.bad
                    try:
                        connection.infer(args.model, bad if is_bad else good)
                        outcome = "other" if is_bad else "good"
                    except InferenceServerException as e:
                        outcome = "bad (400)" if is_bad and e.status() == "400" else "other"
                        if outcome == "other":
                            others.append(str(e))
                    with lock:
                        counts[outcome] += 1

        threads = [threading.Thread(target=client, args=(i,)) for i in range(args.clients)]
        for t in threads:
            t.start()
        while time.perf_counter() < end:
            samples.append((time.perf_counter() - start, _rss_mib(served.process.pid)))
            time.sleep(SAMPLE_S)
        for t in threads:
            t.join()
        time.sleep(0.5)
        metrics = urllib.request.urlopen(f"http://{served.url}/metrics").read().decode()
        status = served.stop()

    def at(share: float) -> float:
        return next(rss for t, rss in samples if t >= share * args.seconds * 0.999)

    early, middle, last = at(0.1), at(0.5), samples[-1][1]
    print(
        f"flowrt serve, {args.model}, {args.clients} clients, {args.seconds:g} s, {args.bad:.0%} bad requests\n"
    )
    print("| requests | good | bad, answered 400 | anything else |")
    print("| --- | ---: | ---: | ---: |")
    print(f"| count | {counts['good']} | {counts['bad (400)']} | {counts['other']} |")
    print("\n| RSS MiB | at 10% | at 50% | at the end | growth from 10% |")
    print("| --- | ---: | ---: | ---: | ---: |")
    print(
        f"| server | {early:.1f} | {middle:.1f} | {last:.1f} | {last - early:+.1f} ({(last - early) / early:+.1%}) |"
    )
    free = _gauge(metrics, "flowrt_pools_free", args.model)
    held = _gauge(metrics, "flowrt_pools", args.model)
    waiting = _gauge(metrics, "flowrt_requests_waiting", args.model)
    print(f"\npools free {free:g} of {held:g}; requests waiting {waiting:g}; exit status on SIGTERM {status}")
    if others:
        print(f"first unexpected answer: {others[0]}")


if __name__ == "__main__":
    main()
