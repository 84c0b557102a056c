"""Load time per layer count: a chain of Relu / Add layers, ``flowrt.optimize`` and ``rt.load``.

    python benchmarks/load_time.py [--layers 1000 2000 4000 8000 20000] [--backend CpuRef]

The chain alternates Relu and Add (of the network input) on a ``(1, 8)`` float32 tensor, so
the kernels cost nothing and the figures are the engine's own per-layer work at load time:
graph passes and backend assignment (optimize), workloads, dataflow and memory plan (load).
Both should grow linearly with the number of layers.
"""

from __future__ import annotations

import argparse
import time

import trio

import flowrt
from flowrt.types import TensorInfo


def chain(layers: int) -> flowrt.Network:
    """A chain of ``layers`` layers alternating Relu and Add of the input, on a (1, 8) tensor."""
    net = flowrt.Network()
    x = net.add_input("x", TensorInfo((1, 8)))
    prev = x
    for i in range(layers):
        inputs = [prev] if i % 2 == 0 else [prev, x]
        prev = net.add_layer("Relu" if i % 2 == 0 else "Add", inputs=inputs, name=f"l{i}")
    net.add_output("y", prev)
    return net


async def measure(layers: int, backend: str) -> tuple[float, float]:
    """Seconds spent in ``flowrt.optimize`` and in ``rt.load`` for a chain of ``layers``."""
    net = chain(layers)
    start = time.perf_counter()
    optimized = flowrt.optimize(net, backends=[backend])
    optimized_at = time.perf_counter()
    async with flowrt.Runtime(cpu_workers=1) as rt:
        loaded_from = time.perf_counter()
        await rt.load(optimized)
        loaded_at = time.perf_counter()
    return optimized_at - start, loaded_at - loaded_from


def main() -> None:
    """Print optimize and load seconds, and microseconds per layer, for each layer count."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, nargs="+", default=[1000, 2000, 4000, 8000, 20000])
    parser.add_argument("--backend", default="CpuRef")
    args = parser.parse_args()
    print(f"{'layers':>8} {'optimize s':>11} {'load s':>8} {'total s':>8} {'us/layer':>9}")
    for layers in args.layers:
        optimize_s, load_s = trio.run(measure, layers, args.backend)
        total = optimize_s + load_s
        print(
            f"{layers:>8} {optimize_s:>11.2f} {load_s:>8.2f} {total:>8.2f} {total / layers * 1e6:>9.0f}",
            flush=True,
        )


if __name__ == "__main__":
    main()
