"""A two-model pipeline on a Ray cluster: squeezenet on one node, a small head model on another.

    python examples/ray_pipeline.py [--address ADDRESS] [--requests 32] [--backends CpuAcc,CpuRef]

Without ``--address`` it starts a local cluster of two nodes (``ray.cluster_utils.Cluster``, on
loopback) and stops it at the end; with one it joins that cluster. Squeezenet (the light model
that ships with onnx) runs on the first node, a small head model (a dense layer and a softmax
over squeezenet's 1000 scores) on the second. The script prints where each stage runs, the
pipeline's throughput over ``--requests`` images, and checks that every result equals a local
``flowrt.Pipeline``'s; it exits with 1 if one does not, or if the two stages share a node on a
cluster of several.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np
import trio

import flowrt
from flowrt import TensorInfo, descriptors
from flowrt.models import light_model


def head_net(classes: int = 16) -> flowrt.Network:
    """The second model: squeezenet's (1, 1000, 1, 1) scores -> a dense layer -> softmax."""
    rng = np.random.default_rng(7)
    net = flowrt.Network()
    scores = net.add_input("softmaxout_1", TensorInfo((1, 1000, 1, 1)))
    flat = net.add_layer("Flatten", descriptors.Flatten(axis=1), [scores])
    weights = rng.standard_normal((1000, classes)).astype(np.float32)
    dense = net.add_layer("MatMul", inputs=[flat, weights])
    net.add_output("classes", net.add_layer("Softmax", inputs=[dense]))
    return net


def images(n: int) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(0)
    return [{"data_0": rng.random((1, 3, 224, 224), dtype=np.float32)} for _ in range(n)]


async def local_results(backends: list[str], feeds: list[dict[str, np.ndarray]]) -> list[dict]:
    """The same two models in a local flowrt.Pipeline, on one CPU worker as each replica: the
    light squeezenet's logits are near 1e10, so how a layer's window is split across threads
    changes the rounding of its softmax (see ``flowrt.models``)."""
    async with flowrt.Runtime(cpu_workers=1) as rt:
        first = await rt.load(flowrt.optimize(flowrt.onnx.load(light_model("squeezenet")), backends))
        second = await rt.load(flowrt.optimize(head_net(), backends))
        pipeline = flowrt.Pipeline([first, second])
        return [await pipeline.run(f) for f in feeds]


def two_nodes(ray) -> tuple[str, str]:
    """Node ids for the two stages: two different nodes when the cluster has them."""
    alive = sorted(n["NodeID"] for n in ray.nodes() if n["Alive"])
    return alive[0], alive[-1]


async def run_on_ray(
    ray, backends: list[str], feeds: list[dict[str, np.ndarray]]
) -> tuple[list, float, dict]:
    import flowrt.ray

    first, second = two_nodes(ray)
    stages = [
        flowrt.ray.Stage(light_model("squeezenet"), name="squeezenet", node=first, backends=backends),
        flowrt.ray.Stage(head_net(), name="head", node=second, backends=backends),
    ]
    async with flowrt.ray.Pipeline(stages) as pipeline:
        await pipeline.run(feeds[0])  # warm: the first run of each replica
        results = []
        start = time.perf_counter()
        async with pipeline.stream() as s:

            async def produce() -> None:
                for f in feeds:
                    await s.send(f)
                s.close()

            async with trio.open_nursery() as nursery:
                nursery.start_soon(produce)
                async for outputs in s:
                    results.append(outputs)
        seconds = time.perf_counter() - start
        return results, seconds, pipeline.placement


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--address", help="a Ray cluster to join (default: start two local nodes)")
    parser.add_argument("--requests", type=int, default=32)
    parser.add_argument("--backends", default="CpuAcc,CpuRef")
    args = parser.parse_args()
    backends = args.backends.split(",")
    if args.address is None:
        # A local cluster stays on loopback: Ray is told this machine is no real cluster
        # (before it is imported), so that it hands out 127.0.0.1 rather than the machine's address.
        os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    import ray
    from ray.cluster_utils import Cluster

    cluster = None
    if args.address is None:
        cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
        cluster.add_node(num_cpus=1)
        address = cluster.address
    else:
        address = args.address
    try:
        ray.init(address=address, include_dashboard=False, log_to_driver=False)
        if cluster is not None:
            cluster.wait_for_nodes()
        feeds = images(args.requests)
        results, seconds, placement = trio.run(run_on_ray, ray, backends, feeds)
        nodes = len([n for n in ray.nodes() if n["Alive"]])
    finally:
        ray.shutdown()
        if cluster is not None:
            cluster.shutdown()
    for name, replicas in placement.items():
        print(f"stage {name} on node {', '.join(replicas)}")
    print(f"throughput: {len(feeds) / seconds:.1f} requests/s ({len(feeds)} requests in {seconds:.2f} s)")
    expected = trio.run(local_results, backends, feeds)
    diff = max(float(np.abs(r["classes"] - e["classes"]).max()) for r, e in zip(results, expected))
    same = len(results) == len(expected) and diff <= 1e-6
    print(f"outputs equal the local pipeline's: {'yes' if same else 'NO'} (max abs diff {diff:.3g})")
    spread = nodes < 2 or placement["squeezenet"][0] != placement["head"][0]
    if not spread:
        print("the two stages share a node on a cluster of several")
    return 0 if same and spread else 1


if __name__ == "__main__":
    sys.exit(main())
