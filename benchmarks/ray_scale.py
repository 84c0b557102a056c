"""flowrt.ray: throughput of one replica against two, and what a request costs over Ray.

    python benchmarks/ray_scale.py [--address ADDRESS] [--model resnet50] [--requests 64]
        [--backends CpuAcc,CpuRef] [--sizes 0,1,16] [--runs 15] [--rounds 4]

Without ``--address`` it starts a local cluster of two nodes on loopback
(``ray.cluster_utils.Cluster``): the head, where this driver runs, and a second node; with one
it joins that cluster (the transfer table then needs a second node to place on). Two tables:

- scale: the model (a light model's name or an .onnx path; by default resnet50, about 140 ms
  a run on one thread here, beside which Ray's few ms per request are small: inception_v1's
  50 ms and squeezenet's 11 ms show how much of a shorter run they take), pinned to one
  thread per replica (``Runtime(cpu_workers=1)``, one memory pool): a local ``flowrt.Pipeline`` of it, a
  ``flowrt.ray.Pipeline`` of one replica and one of two, all three up at once and taking
  turns: ``--requests`` requests streamed through each in ``--rounds`` rounds (req/s), and
  ``--runs`` lone requests each, one after the other (median latency). Then the ratio of two
  replicas to one (target ``TARGET``) and the overhead of a lone request over Ray against the
  local pipeline.
- transfer: a model that reads and writes ``--sizes`` MiB (a Relu over a float32 vector), run
  ``--runs`` times locally, on a replica on this node and on one on the other node, taking
  turns: the median cost of a request over the local run, and per MiB (the slope between the
  two largest sizes). A request carries its input to the replica and its output back, so one
  MiB here is a MiB each way.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import os
import statistics
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import numpy as np
import trio

import flowrt
from flowrt import TensorInfo
from flowrt.models import light_model, pattern_input

TARGET = 1.6  # two replicas against one, on a 2-core machine
MIB = 1 << 20


def _model_path(name: str) -> Path:
    return Path(name) if name.endswith(".onnx") else light_model(name)


def _relu_net(mib: float) -> flowrt.Network:
    n = max(16, int(mib * MIB) // 4)
    net = flowrt.Network()
    net.add_output("y", net.add_layer("Relu", inputs=[net.add_input("x", TensorInfo((1, n)))]))
    return net


async def _lone_latencies(runs: dict[str, Callable[[], Awaitable[Any]]], rounds: int) -> dict[str, float]:
    """Median latency of each setup's lone request, the setups taking turns request by request
    (so that all see the same machine, which other work may share)."""
    for run in runs.values():
        await run()  # warm
    times: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(rounds):
        for name, run in runs.items():
            start = time.perf_counter()
            await run()
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(t) for name, t in times.items()}


async def _stream_seconds(pipeline: Any, feeds: dict[str, np.ndarray], requests: int) -> float:
    """Seconds to stream ``requests`` requests through ``pipeline``, sent as fast as it takes them."""
    start = time.perf_counter()
    async with pipeline.stream() as s:

        async def produce() -> None:
            for _ in range(requests):
                await s.send(feeds)
            s.close()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(produce)
            async for _ in s:
                pass
    return time.perf_counter() - start


async def _throughputs(
    pipelines: dict[str, Any], feeds: dict, requests: int, rounds: int
) -> dict[str, float]:
    """Requests/s of each pipeline, the pipelines taking turns round by round."""
    seconds = dict.fromkeys(pipelines, 0.0)
    share = max(1, requests // rounds)
    for _ in range(rounds):
        for name, pipeline in pipelines.items():
            seconds[name] += await _stream_seconds(pipeline, feeds, share)
    return {name: share * rounds / s for name, s in seconds.items()}


async def _local_pipeline(stack: contextlib.AsyncExitStack, net: flowrt.Network, backends: list[str]) -> Any:
    """A local flowrt.Pipeline of ``net`` on one CPU worker and one memory pool."""
    rt = await stack.enter_async_context(flowrt.Runtime(cpu_workers=1))
    model = await rt.load(flowrt.optimize(net, backends), max_in_flight=1)
    return flowrt.Pipeline([model])


async def scale(args: argparse.Namespace, backends: list[str]) -> None:
    import flowrt.ray

    path = _model_path(args.model)
    net = flowrt.onnx.load(path)
    feeds = {name: pattern_input(info) for name, info in net.inputs.items()}
    async with contextlib.AsyncExitStack() as stack:
        pipelines = {"local": await _local_pipeline(stack, net, backends)}
        for replicas in (1, 2):
            # num_cpus=0: the three setups are up at once, one of them busy at a time
            stage = flowrt.ray.Stage(
                path, replicas=replicas, cpu_workers=1, pools=1, backends=backends, num_cpus=0
            )
            pipelines[f"ray{replicas}"] = await stack.enter_async_context(flowrt.ray.Pipeline([stage]))
        lone = await _lone_latencies(
            {k: functools.partial(p.run, feeds) for k, p in pipelines.items()}, args.runs
        )
        rates = await _throughputs(pipelines, feeds, args.requests, args.rounds)
    labels = {
        "local": "local flowrt.Pipeline, 1 thread",
        "ray1": "flowrt.ray.Pipeline, 1 replica x 1 thread",
        "ray2": "flowrt.ray.Pipeline, 2 replicas x 1 thread",
    }
    print(
        f"\nscale: {args.model}, {args.requests} requests streamed in {args.rounds} rounds, median of {args.runs} lone runs\n"
    )
    print("| pipeline | req/s | lone request, median ms |")
    print("| --- | ---: | ---: |")
    for key, label in labels.items():
        print(f"| {label} | {rates[key]:.1f} | {lone[key] * 1e3:.2f} |")
    print(f"\n2 replicas / 1 replica: {rates['ray2'] / rates['ray1']:.2f}x (target >= {TARGET})")
    print(
        f"per-request overhead over the local pipeline: {(lone['ray1'] - lone['local']) * 1e3:.2f} ms (lone requests)"
    )


async def transfer(args: argparse.Namespace, backends: list[str], nodes: dict[str, str]) -> None:
    import flowrt.ray

    sizes = [float(s) for s in args.sizes.split(",")]
    costs: dict[str, list[float]] = {where: [] for where in nodes}
    print(f"\ntransfer: a Relu over float32 vectors, median of {args.runs} lone runs\n")
    print("| MiB each way | local ms | " + " | ".join(f"Ray, {w} ms | over local" for w in nodes) + " |")
    print("| ---: | ---: |" + " ---: | ---: |" * len(nodes))
    for mib in sizes:
        net = _relu_net(mib)
        feeds = {"x": np.ones((1, max(16, int(mib * MIB) // 4)), np.float32)}
        async with contextlib.AsyncExitStack() as stack:
            pipelines = {"local": await _local_pipeline(stack, net, backends)}
            for where, node in nodes.items():
                stage = flowrt.ray.Stage(net, node=node, backends=backends, num_cpus=0)
                pipelines[where] = await stack.enter_async_context(flowrt.ray.Pipeline([stage]))
            lone = await _lone_latencies(
                {k: functools.partial(p.run, feeds) for k, p in pipelines.items()}, args.runs
            )
        cells = []
        for where in nodes:
            costs[where].append(lone[where] - lone["local"])
            cells.append(f"{lone[where] * 1e3:.2f} | {costs[where][-1] * 1e3:.2f}")
        print(f"| {mib:g} | {lone['local'] * 1e3:.2f} | " + " | ".join(cells) + " |")
    if len(sizes) >= 2:
        span = sizes[-1] - sizes[-2]
        for where, cost in costs.items():
            print(f"Ray, {where}: {(cost[-1] - cost[-2]) / span * 1e3:.2f} ms per MiB each way")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--address")
    parser.add_argument("--model", default="resnet50")
    parser.add_argument("--requests", type=int, default=64)
    parser.add_argument("--runs", type=int, default=15)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--backends", default="CpuAcc,CpuRef")
    parser.add_argument("--sizes", default="0,1,16")
    args = parser.parse_args()
    backends = args.backends.split(",")
    if args.address is None:
        os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")  # loopback only
    import ray
    from ray.cluster_utils import Cluster

    cluster = None
    if args.address is None:
        store = 512 * MIB
        cluster = Cluster(
            initialize_head=True,
            head_node_args={
                "num_cpus": os.cpu_count() or 2,
                "include_dashboard": False,
                "object_store_memory": store,
            },
        )
        cluster.add_node(num_cpus=0, object_store_memory=store)
    try:
        ray.init(
            address=cluster.address if cluster else args.address, include_dashboard=False, log_to_driver=False
        )
        if cluster is not None:
            cluster.wait_for_nodes()
        here = ray.get_runtime_context().get_node_id()
        others = [n["NodeID"] for n in ray.nodes() if n["Alive"] and n["NodeID"] != here]
        nodes = {"this node": here, **({"other node": others[0]} if others else {})}
        trio.run(scale, args, backends)
        trio.run(transfer, args, backends, nodes)
    finally:
        ray.shutdown()
        if cluster is not None:
            cluster.shutdown()


if __name__ == "__main__":
    main()
